"""The provider protocol, the values it trades in, retries and per-run accounting.

A :class:`Provider` turns a list of :class:`Message` into a :class:`Completion`. Providers
retry transient failures themselves (:class:`RetryPolicy`), raise :class:`ProviderError` with a
redacted message for everything else, and add every call to a :class:`RunAccounting`.
"""

from __future__ import annotations

import logging
import math
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

from klineage.llm.redact import redact

__all__ = [
    "DEFAULT_PRICES",
    "GENERATION_OPTIONS",
    "Completion",
    "ErrorKind",
    "Message",
    "Price",
    "Provider",
    "ProviderError",
    "RetryPolicy",
    "Role",
    "RunAccounting",
    "Usage",
    "normalize_options",
    "with_retries",
]

log = logging.getLogger("klineage.llm")

Role = Literal["system", "user", "assistant"]
ErrorKind = Literal[
    "config",  # no key, no base URL, a bad spec: fix the configuration
    "dependency",  # the SDK is not installed
    "auth",  # 401/403: the key is wrong or lacks permission
    "not_found",  # 404: usually an unknown model name
    "bad_request",  # 400/413/422: the request itself was refused
    "rate_limit",  # 429
    "server",  # 5xx (and 408/409/529)
    "timeout",  # no answer within the per-request timeout
    "connection",  # the server could not be reached
    "bad_response",  # an answer that is not what the wire format promises
    "cache_miss",  # replay-only mode and the answer is not in the cache
]

RETRYABLE: frozenset[str] = frozenset({"rate_limit", "server", "timeout", "connection"})
FATAL: frozenset[str] = frozenset({"config", "dependency", "auth", "not_found", "cache_miss"})

GENERATION_OPTIONS: dict[str, tuple[type, ...]] = {
    "max_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "stop": (list, tuple),
    "seed": (int,),
}
"""Options ``complete`` accepts, with their types. They are part of the cache key."""


@dataclass(frozen=True)
class Message:
    """One turn of a conversation."""

    role: Role
    """``system`` (instructions), ``user`` or ``assistant``."""
    content: str
    """The text of the turn."""

    def __post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant"):
            raise ValueError(f"message role must be system, user or assistant, not {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(f"message content must be a str, not {type(self.content).__name__}")


@dataclass(frozen=True)
class Usage:
    """Tokens one call consumed, as the server reported them (0 when it reported none)."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Generated tokens."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )

    @property
    def total_tokens(self) -> int:
        """Input and output tokens together."""
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class Completion:
    """The answer to one ``complete`` call."""

    text: str
    """The generated text (all text blocks joined)."""
    usage: Usage
    """Tokens consumed by the call that produced the text."""
    model: str
    """The model that answered, as the server named it (else the requested model)."""
    provider: str
    """The provider kind: ``anthropic``, ``openai`` or ``openai-compatible``."""
    latency_s: float = 0.0
    """Wall time of the successful request (0 for an answer served from the cache)."""
    cached: bool = False
    """True when the answer came from the response cache, not the network."""
    finish_reason: str | None = None
    """Why generation stopped (``end_turn``, ``stop``, ``max_tokens``, ``length``...)."""
    attempts: int = 1
    """Requests sent, retries included (0 for a cached answer)."""

    def to_dict(self) -> dict[str, Any]:
        """The completion as plain data (for the response cache)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Completion:
        """A completion read back from `to_dict`'s data."""
        usage = data.get("usage") or {}
        return cls(
            text=str(data["text"]),
            usage=Usage(int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))),
            model=str(data["model"]),
            provider=str(data["provider"]),
            latency_s=float(data.get("latency_s", 0.0)),
            cached=bool(data.get("cached", False)),
            finish_reason=data.get("finish_reason"),
            attempts=int(data.get("attempts", 1)),
        )


class ProviderError(RuntimeError):
    """A call to an LLM provider failed. The message never contains a key."""

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        status: int | None = None,
        retry_after: float | None = None,
        attempts: int = 1,
    ) -> None:
        self.message = redact(message)
        self.kind: ErrorKind = kind
        self.status = status
        self.retry_after = retry_after
        self.attempts = attempts
        super().__init__(self.message)

    @property
    def retryable(self) -> bool:
        """A failure that may go away if the same request is sent again."""
        return self.kind in RETRYABLE

    @property
    def fatal(self) -> bool:
        """A failure every later call will repeat (configuration, key, model, replay miss)."""
        return self.kind in FATAL

    def __reduce__(self) -> tuple[Any, ...]:  # picklable across processes, still redacted
        return (
            _rebuild_error,
            (self.message, self.kind, self.status, self.retry_after, self.attempts),
        )


def _rebuild_error(
    message: str, kind: ErrorKind, status: int | None, retry_after: float | None, attempts: int
) -> ProviderError:
    return ProviderError(
        message, kind=kind, status=status, retry_after=retry_after, attempts=attempts
    )


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter for rate limits, server errors, timeouts, lost
    connections. A ``retry-after`` the server sends is honoured (never waiting less)."""

    max_attempts: int = 5
    """Requests per call, the first included."""
    base_delay_s: float = 1.0
    """Wait before the first retry; doubled for each later one."""
    max_delay_s: float = 60.0
    """Cap on the computed backoff."""
    jitter: float = 0.25
    """Each wait is stretched by a random factor in [1, 1 + jitter]."""
    max_retry_after_s: float = 300.0
    """A server asking for a longer wait than this makes the call fail at once."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if min(self.base_delay_s, self.max_delay_s, self.jitter, self.max_retry_after_s) < 0:
            raise ValueError("retry delays and jitter must be >= 0")

    def delay(
        self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        backoff = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        backoff *= 1.0 + self.jitter * (rng or random).random()
        if retry_after is not None and retry_after > 0:
            return max(backoff, retry_after)
        return backoff


T = TypeVar("T")


def with_retries(
    attempt: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> tuple[T, int]:
    """Run ``attempt`` until it succeeds, retrying retryable :class:`ProviderError`.

    Returns the result and the number of attempts made. The last error is re-raised with the
    attempt count in its message.
    """
    n = 0
    while True:
        n += 1
        try:
            return attempt(), n
        except ProviderError as err:
            failure = err
        too_long = (
            failure.retry_after is not None and failure.retry_after > policy.max_retry_after_s
        )
        if not failure.retryable or n >= policy.max_attempts or too_long:
            break
        wait = policy.delay(n, failure.retry_after, rng)
        log.warning(
            "%s; retrying in %.2f s (attempt %d of %d)",
            failure.message,
            wait,
            n + 1,
            policy.max_attempts,
        )
        sleep(wait)
    detail = failure.message
    if too_long:
        detail += (
            f"; the server asked to wait {failure.retry_after:g} s, more than the "
            f"{policy.max_retry_after_s:g} s the retry policy allows"
        )
    elif failure.retryable:
        detail += f" (gave up after {n} attempt{'s' if n != 1 else ''})"
    raise ProviderError(
        detail,
        kind=failure.kind,
        status=failure.status,
        retry_after=failure.retry_after,
        attempts=n,
    )


def normalize_options(options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Validate generation options, fill defaults, drop Nones; sorted for a stable cache key."""
    unknown = sorted(set(options) - set(GENERATION_OPTIONS))
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(unknown)}; complete() takes: "
            f"{', '.join(GENERATION_OPTIONS)}"
        )
    merged = {**defaults, **options}
    out: dict[str, Any] = {}
    for name in sorted(merged):
        value = merged[name]
        if value is None:
            continue
        types = GENERATION_OPTIONS[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise TypeError(f"option {name} must be {' or '.join(t.__name__ for t in types)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"option {name} must be finite")
        out[name] = list(value) if name == "stop" and isinstance(value, list | tuple) else value
    return out


@runtime_checkable
class Provider(Protocol):
    """Anything that answers a conversation. Implementations: ``AnthropicProvider``,
    ``OpenAIProvider``, and ``CachedProvider`` wrapping either."""

    @property
    def kind(self) -> str:
        """``anthropic``, ``openai`` or ``openai-compatible``; part of the cache key."""
        ...

    @property
    def model(self) -> str:
        """The model asked for."""
        ...

    @property
    def accounting(self) -> RunAccounting:
        """Where calls are added up."""
        ...

    def complete(self, messages: Sequence[Message], **options: Any) -> Completion:
        """Answer ``messages``; raise :class:`ProviderError` when no answer can be had."""
        ...


# ------------------------------------------------------------------------------ accounting


class Price(NamedTuple):
    """USD per million tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, usage: Usage) -> float:
        """USD for `usage` at this price."""
        return (
            usage.input_tokens * self.input_per_mtok + usage.output_tokens * self.output_per_mtok
        ) / 1e6


DEFAULT_PRICES: dict[str, Price] = {
    # Estimated list prices of models whose prices we know; newer models are left out rather
    # than guessed (they show up in RunAccounting.unpriced_models). A key matches the model
    # of that name and its dated snapshots ("-20250514", "-2024-07-18") or "-latest"; add
    # RunAccounting(prices={"name": Price(...), "prefix*": ...}) for anything else.
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4-1": Price(15.0, 75.0),
    "claude-opus-4": Price(15.0, 75.0),
    "claude-opus-4-0": Price(15.0, 75.0),
    "claude-sonnet-4-5": Price(3.0, 15.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-sonnet-4-0": Price(3.0, 15.0),
    "claude-3-7-sonnet": Price(3.0, 15.0),
    "claude-haiku-4-5": Price(1.0, 5.0),
    "claude-3-5-haiku": Price(0.8, 4.0),
    "gpt-4o": Price(2.5, 10.0),
    "gpt-4o-mini": Price(0.15, 0.6),
    "gpt-4.1": Price(2.0, 8.0),
    "gpt-4.1-mini": Price(0.4, 1.6),
    "gpt-4.1-nano": Price(0.1, 0.4),
    "gpt-5": Price(1.25, 10.0),
    "gpt-5-mini": Price(0.25, 2.0),
    "gpt-5-nano": Price(0.05, 0.4),
    "o3": Price(2.0, 8.0),
    "o3-mini": Price(1.1, 4.4),
    "o4-mini": Price(1.1, 4.4),
}

_SNAPSHOT = re.compile(r"-(?:\d{8}|\d{4}-\d{2}-\d{2}|latest)$")


def _price_key_matches(key: str, model: str) -> bool:
    """``key`` names ``model``: the same name, a dated snapshot of it, or a ``prefix*``."""
    if key.endswith("*"):
        return model.startswith(key[:-1])
    return model == key or (model.startswith(key) and bool(_SNAPSHOT.fullmatch(model[len(key) :])))


@dataclass
class ModelTotals:
    """Calls and tokens of one provider and model within a run."""

    calls: int = 0
    """Answers fetched over the network."""
    cached_calls: int = 0
    """Answers served from the cache (no tokens billed)."""
    failed_calls: int = 0
    """Calls that ended in a ProviderError."""
    attempts: int = 0
    """HTTP requests sent, retries included."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = 0.0
    """Estimated cost; None when the model has no price."""


@dataclass
class RunAccounting:
    """Tokens, calls and an estimated cost, summed over one run (thread-safe).

    ``prices`` entries override :data:`DEFAULT_PRICES`: keys are model names (matching their
    dated snapshots too) or ``prefix*`` patterns, either optionally scoped to one provider
    kind as ``"kind:name"``; values are :class:`Price` or ``(input, output)`` USD per million
    tokens. Models behind an ``openai-compatible`` server are priced only by explicit
    entries: their names say nothing about what they cost.
    """

    prices: Mapping[str, Price] = field(default_factory=dict)
    by_model: dict[str, ModelTotals] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def price_for(self, kind: str, model: str) -> Price | None:
        """The price of ``model`` behind a ``kind`` provider, or None when unknown."""
        table: dict[str, Price] = {}
        if kind != "openai-compatible":
            table.update(DEFAULT_PRICES)
        for key, price in self.prices.items():
            scope, sep, name = key.partition(":")
            if not sep or scope not in ("anthropic", "openai", "openai-compatible"):
                table[key] = Price(*price)  # no provider scope (a model name may hold ':')
            elif scope == kind:
                table[name] = Price(*price)
        matches = [key for key in table if _price_key_matches(key, model)]
        # the most specific key wins: an exact name over a prefix, a longer prefix over a shorter
        return table[max(matches, key=lambda k: (not k.endswith("*"), len(k)))] if matches else None

    def _totals(self, kind: str, model: str) -> ModelTotals:
        return self.by_model.setdefault(f"{kind}:{model}", ModelTotals())

    def record(self, completion: Completion, *, requested_model: str | None = None) -> None:
        """Add one answer (cached answers count as calls that cost nothing)."""
        model = requested_model or completion.model
        with self._lock:
            totals = self._totals(completion.provider, model)
            if completion.cached:
                totals.cached_calls += 1
                return
            totals.calls += 1
            totals.attempts += completion.attempts
            totals.input_tokens += completion.usage.input_tokens
            totals.output_tokens += completion.usage.output_tokens
            price = self.price_for(completion.provider, completion.model) or self.price_for(
                completion.provider, model
            )
            if price is None:
                totals.cost_usd = None
            elif totals.cost_usd is not None:
                totals.cost_usd += price.cost(completion.usage)

    def record_failure(self, kind: str, model: str, error: ProviderError) -> None:
        """Add up a call that failed after its attempts."""
        with self._lock:
            totals = self._totals(kind, model)
            totals.failed_calls += 1
            totals.attempts += error.attempts

    def _sum(self, name: str) -> int:
        with self._lock:
            return sum(getattr(t, name) for t in self.by_model.values())

    @property
    def calls(self) -> int:
        """Calls answered, all models."""
        return self._sum("calls")

    @property
    def cached_calls(self) -> int:
        """Calls answered from the cache, all models."""
        return self._sum("cached_calls")

    @property
    def failed_calls(self) -> int:
        """Calls that failed, all models."""
        return self._sum("failed_calls")

    @property
    def attempts(self) -> int:
        """Requests sent, retries included, all models."""
        return self._sum("attempts")

    @property
    def usage(self) -> Usage:
        """Tokens used, all models."""
        return Usage(self._sum("input_tokens"), self._sum("output_tokens"))

    @property
    def cost_usd(self) -> float:
        """Estimated cost of the priced models (see :attr:`unpriced_models`)."""
        with self._lock:
            return sum(t.cost_usd or 0.0 for t in self.by_model.values())

    @property
    def unpriced_models(self) -> list[str]:
        """Models used whose price is unknown (their cost is left out)."""
        with self._lock:
            return sorted(k for k, t in self.by_model.items() if t.cost_usd is None)

    def summary(self) -> dict[str, Any]:
        """Plain data for a report or an artifact."""
        usage = self.usage
        with self._lock:
            by_model = {k: asdict(v) for k, v in sorted(self.by_model.items())}
        return {
            "calls": self.calls,
            "cached_calls": self.cached_calls,
            "failed_calls": self.failed_calls,
            "attempts": self.attempts,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost_usd": round(self.cost_usd, 6),
            "unpriced_models": self.unpriced_models,
            "by_model": by_model,
        }
