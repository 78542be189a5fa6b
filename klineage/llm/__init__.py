"""LLM providers: Anthropic, OpenAI, and any OpenAI-compatible server (vLLM, Ollama,
llama.cpp), used to propose simplifications and materialize skills beyond the rule catalog.

Nothing here imports an SDK until a provider makes its first call, so klineage works exactly
as before without them (``pip install 'klineage[llm]'`` adds them).

    from klineage.llm import ResponseCache, propose_removal, provider_from_spec

    provider = provider_from_spec("anthropic:claude-sonnet-4-5", cache=ResponseCache())
    outcome = propose_removal(provider, kernel, problem, ["vectorized_loads"])
    print(outcome.ok, provider.accounting.summary())

Specs: ``anthropic:MODEL``, ``openai:MODEL``, ``openai-compatible:MODEL@http://HOST:PORT/v1``.
Keys come from ``ANTHROPIC_API_KEY`` / ``OPENAI_API_KEY`` / ``KLINEAGE_LLM_API_KEY`` (the last
for compatible servers) or ``api_key=``; they never appear in logs, files or error messages.
"""

from __future__ import annotations

from typing import Any

from klineage.llm.anthropic_provider import AnthropicProvider
from klineage.llm.base import (
    DEFAULT_PRICES,
    Completion,
    Message,
    Price,
    Provider,
    ProviderError,
    RetryPolicy,
    RunAccounting,
    Usage,
)
from klineage.llm.cache import CachedProvider, CacheMiss, ResponseCache, cache_key
from klineage.llm.openai_provider import OpenAICompatibleProvider, OpenAIProvider
from klineage.llm.proposals import (
    Proposal,
    Rejection,
    build_proposal,
    describe_problem,
    materialize_skill,
    parse_prose_answer,
    parse_source_answer,
    propose_removal,
    write_skill_prose,
)
from klineage.llm.redact import redact
from klineage.llm.templates import render

__all__ = [
    "DEFAULT_PRICES",
    "PROVIDER_KINDS",
    "AnthropicProvider",
    "CacheMiss",
    "CachedProvider",
    "Completion",
    "Message",
    "OpenAICompatibleProvider",
    "OpenAIProvider",
    "Price",
    "Proposal",
    "Provider",
    "ProviderError",
    "Rejection",
    "ResponseCache",
    "RetryPolicy",
    "RunAccounting",
    "Usage",
    "build_proposal",
    "cache_key",
    "describe_problem",
    "materialize_skill",
    "parse_prose_answer",
    "parse_source_answer",
    "parse_spec",
    "propose_removal",
    "provider_from_spec",
    "redact",
    "render",
    "write_skill_prose",
]

PROVIDER_KINDS: dict[str, type[AnthropicProvider | OpenAIProvider]] = {
    "anthropic": AnthropicProvider,
    "openai": OpenAIProvider,
    "openai-compatible": OpenAICompatibleProvider,
}


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """``KIND:MODEL[@BASE_URL]`` as (kind, model, base URL or None).

    The model may itself hold colons (``qwen2.5-coder:32b``); a base URL follows the last
    ``@`` and must start with http:// or https://.
    """
    kind, sep, rest = spec.strip().partition(":")
    if not sep or kind not in PROVIDER_KINDS:
        raise ProviderError(
            f"bad provider spec {spec!r}; expected one of: anthropic:MODEL, openai:MODEL, "
            "openai-compatible:MODEL@http://HOST:PORT/v1",
            kind="config",
        )
    model, base_url = rest, None
    head, at, tail = rest.rpartition("@")
    if at and tail.startswith(("http://", "https://")):
        model, base_url = head, tail
    elif at and "://" in tail:
        raise ProviderError(f"bad base URL in {spec!r}: use http:// or https://", kind="config")
    if not model:
        raise ProviderError(f"no model in provider spec {spec!r}", kind="config")
    return kind, model, base_url


def provider_from_spec(spec: str, *, cache: ResponseCache | None = None, **kwargs: Any) -> Provider:
    """A provider from ``anthropic:MODEL``, ``openai:MODEL`` or
    ``openai-compatible:MODEL@http://HOST:PORT/v1``.

    ``kwargs`` go to the provider (``api_key``, ``base_url``, ``timeout_s``, ``retry``,
    ``accounting``); a base URL in the spec wins over ``OPENAI_BASE_URL``. With ``cache``, the
    provider answers from it first (and, in replay-only mode, never calls out: no key or SDK
    is needed then).
    """
    kind, model, base_url = parse_spec(spec)
    if base_url is not None:
        kwargs["base_url"] = base_url
    provider: Provider = PROVIDER_KINDS[kind](model, **kwargs)
    return cache.wrap(provider) if cache is not None else provider
