"""The `--llm` options of `klineage mine` and `klineage replay`: open a provider before any gate
run (a missing key or SDK is a clear error, exit 2), and report what it cost at the end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from klineage.llm import ProviderError, ResponseCache, RunAccounting, provider_from_spec, redact
from klineage.llm.base import Provider

LlmOption = Annotated[
    str | None,
    typer.Option(
        "--llm",
        metavar="PROVIDER:MODEL",
        help="Also ask an LLM, under the same gate and budget (the specs are listed above).",
    ),
]
LlmCacheOption = Annotated[
    Path | None,
    typer.Option(
        "--llm-cache",
        help="Where LLM answers are cached (default: $KLINEAGE_LLM_CACHE_DIR or "
        "~/.cache/klineage/llm).",
    ),
]
LlmReplayOnlyOption = Annotated[
    bool,
    typer.Option(
        "--llm-replay-only",
        help="Answer only from the LLM cache, never the network (no key needed; a miss stops "
        "the LLM for the rest of the walk or problem).",
    ),
]


def open_llm(
    spec: str | None, cache: Path | None, replay_only: bool, errors: Console
) -> Provider | None:
    """The provider `--llm` names, ready to answer, or None without `--llm`. Exits with code 2
    and a message (never a key) when it cannot work: a bad spec, no key, no SDK."""
    if spec is None:
        if cache is not None or replay_only:
            _fail(errors, "--llm-cache and --llm-replay-only need --llm PROVIDER:MODEL")
        return None
    try:
        provider = provider_from_spec(
            spec,
            cache=ResponseCache(cache, replay_only=replay_only),
            accounting=RunAccounting(),
        )
        if not replay_only:  # replay-only answers from the cache: no SDK or key needed
            inner = getattr(provider, "inner", provider)
            ready = getattr(inner, "ensure_ready", None)
            if ready is not None:
                ready()
    except ProviderError as err:
        _fail(errors, f"--llm: {err.message}")
    except (TypeError, ValueError) as err:
        _fail(errors, f"--llm: {redact(err)}")
    return provider


def usage_line(provider: Provider) -> str:
    """One line: calls, tokens and the estimated cost of everything the provider was asked."""
    totals: dict[str, Any] = provider.accounting.summary()
    line = (
        f"LLM {provider.kind}:{provider.model}: {totals['calls']} calls "
        f"({totals['cached_calls']} cached, {totals['failed_calls']} failed), "
        f"{totals['input_tokens']:,} input / {totals['output_tokens']:,} output tokens, "
        f"estimated ${totals['cost_usd']:.4f}"
    )
    if totals["unpriced_models"]:
        line += f" (no price known for {', '.join(totals['unpriced_models'])})"
    return line


def _fail(errors: Console, message: str) -> NoReturn:
    errors.print(Text(redact(message), style="red"))
    raise typer.Exit(2)
