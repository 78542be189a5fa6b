"""What the Anthropic and OpenAI providers share: lazy SDK import, one client per provider with
the SDK's own retries off, our retry loop, error translation, accounting.

Both SDKs are generated from the same template, so their exceptions have the same shape:
``APIStatusError`` (with ``status_code`` and ``response``), ``APITimeoutError`` (a subclass of
``APIConnectionError``) and ``APIError`` at the root.
"""

from __future__ import annotations

import email.utils
import importlib
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar
from urllib.parse import urlsplit, urlunsplit

from klineage.llm.base import (
    Completion,
    ErrorKind,
    Message,
    ProviderError,
    RetryPolicy,
    RunAccounting,
    Usage,
    normalize_options,
    with_retries,
)
from klineage.llm.redact import guard_loggers, register_secret

log = logging.getLogger("klineage.llm")

DEFAULT_TIMEOUT_S = 600.0

# The HTTP stacks under the SDKs (their debug logs print requests).
_HTTP_LOGGERS = ("httpx", "httpcore", "httpx2", "httpcore2")


def import_sdk(name: str, kind: str) -> ModuleType:
    """Import an SDK on first use, with an actionable error when it is missing."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ProviderError(
            f"the {kind} provider needs the {name!r} package, which is not installed; "
            "run: pip install 'klineage[llm]'",
            kind="dependency",
        ) from None


def display_url(url: str | None) -> str:
    """A base URL fit to show: no user info, no query string."""
    if not url:
        return "the default endpoint"
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds from ``retry-after-ms`` or ``retry-after`` (a number or an HTTP date)."""
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_kind(status: int) -> ErrorKind:
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status == 404:
        return "not_found"
    if status in (408, 409) or status >= 500:
        return "server"
    return "bad_request"


def _api_message(exc: Any) -> str:
    """The server's own error text, when its body has one; else the SDK's message."""
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error", body)
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(exc, "message", "") or exc)


def translate_error(
    sdk: ModuleType, exc: BaseException, label: str, timeout_s: float, url: str
) -> ProviderError:
    """The :class:`ProviderError` for an exception of the SDK (a subclass of its APIError)."""
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError(f"{label}: no answer within {timeout_s:g} s", kind="timeout")
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
        return ProviderError(f"{label}: cannot connect to {url}{why}", kind="connection")
    if isinstance(exc, sdk.APIStatusError):
        status = int(exc.status_code)
        headers = getattr(getattr(exc, "response", None), "headers", None)
        request_id = headers.get("request-id") or headers.get("x-request-id") if headers else None
        rid = f" [request id {request_id}]" if request_id else ""
        return ProviderError(
            f"{label}: HTTP {status} from {url}: {_api_message(exc)}{rid}",
            kind=_status_kind(status),
            status=status,
            retry_after=parse_retry_after(headers),
        )
    return ProviderError(f"{label}: unusable answer: {exc}", kind="bad_response")


class SdkProvider:
    """Base of the SDK-backed providers; subclasses fill in the wire-format specifics."""

    kind: ClassVar[str] = ""
    sdk_name: ClassVar[str] = ""
    key_env: ClassVar[str | None] = None
    base_url_env: ClassVar[str | None] = None
    default_options: ClassVar[Mapping[str, Any]] = {}

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry: RetryPolicy | None = None,
        accounting: RunAccounting | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError(f"{self.kind}: a model name is required")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.model = model
        self.base_url = base_url or self._env(self.base_url_env)
        self.timeout_s = float(timeout_s)
        self.retry = retry or RetryPolicy()
        self.accounting = accounting if accounting is not None else RunAccounting()
        self._api_key = api_key or self._env(self.key_env) or self._fallback_key()
        register_secret(self._api_key)
        self._sleep = sleep
        self._rng = rng
        self._client: Any = None
        self._sdk: ModuleType | None = None
        self._client_lock = threading.Lock()

    # ------------------------------------------------------------------ configuration

    @staticmethod
    def _env(name: str | None) -> str | None:
        return (os.environ.get(name) or None) if name else None

    def _fallback_key(self) -> str | None:
        return None

    @property
    def label(self) -> str:
        """`kind:model`, for messages."""
        return f"{self.kind}:{self.model}"

    @property
    def has_key(self) -> bool:
        """Whether an API key was found."""
        return bool(self._api_key)

    def __repr__(self) -> str:  # never the key
        return (
            f"{type(self).__name__}(model={self.model!r}, base_url={display_url(self.base_url)!r}, "
            f"timeout_s={self.timeout_s:g})"
        )

    def ensure_ready(self) -> None:
        """Import the SDK and build the client now, so configuration errors surface early."""
        self._get_client()

    def _get_client(self) -> Any:
        with self._client_lock:
            if self._client is None:
                sdk = import_sdk(self.sdk_name, self.kind)
                if not self._api_key:
                    raise ProviderError(
                        # the environment works from the CLI and from Python alike
                        f"{self.label}: no API key; set {self.key_env} in the environment",
                        kind="config",
                    )
                self._sdk = sdk
                guard_loggers(self.sdk_name, *_HTTP_LOGGERS)
                self._client = self._make_client(sdk, self._api_key)
            return self._client

    # ------------------------------------------------------------------ subclass hooks

    def _make_client(self, sdk: ModuleType, api_key: str) -> Any:
        raise NotImplementedError

    def _check(self, messages: Sequence[Message], options: dict[str, Any]) -> None:
        """Refuse, before anything is sent, what this wire format cannot express."""

    def _send(self, client: Any, messages: Sequence[Message], options: dict[str, Any]) -> Any:
        """One request; returns the SDK's response object."""
        raise NotImplementedError

    def _read(self, response: Any) -> tuple[str, int, int, str | None, str | None]:
        """(text, input tokens, output tokens, model, finish reason) of a response."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the call

    def complete(self, messages: Sequence[Message], **options: Any) -> Completion:
        """Send ``messages`` and return the answer, retrying transient failures."""
        if not messages:
            raise ValueError("complete() needs at least one message")
        opts = normalize_options(options, self.default_options)
        self._check(messages, opts)
        client = self._get_client()
        try:
            (response, latency), attempts = with_retries(
                lambda: self._attempt(client, messages, opts),
                self.retry,
                sleep=self._sleep,
                rng=self._rng,
            )
            completion = self._completion(response, latency, attempts)
        except ProviderError as err:
            self.accounting.record_failure(self.kind, self.model, err)
            log.warning("%s: call failed: %s", self.label, err.message)
            raise
        self.accounting.record(completion, requested_model=self.model)
        log.info(
            "%s: %d in / %d out tokens in %.2f s (%d attempt%s)",
            self.label,
            completion.usage.input_tokens,
            completion.usage.output_tokens,
            latency,
            attempts,
            "" if attempts == 1 else "s",
        )
        return completion

    def _attempt(
        self, client: Any, messages: Sequence[Message], opts: dict[str, Any]
    ) -> tuple[Any, float]:
        assert self._sdk is not None
        start = time.perf_counter()
        try:
            return self._send(client, messages, opts), time.perf_counter() - start
        except self._sdk.APIError as exc:
            failure = translate_error(
                self._sdk, exc, self.label, self.timeout_s, display_url(self.base_url)
            )
        raise failure  # outside the except: the SDK error (holding the request) is not chained

    def _completion(self, response: Any, latency: float, attempts: int) -> Completion:
        failure: ProviderError | None = None
        try:
            text, tokens_in, tokens_out, model, finish = self._read(response)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:
            failure = ProviderError(
                f"{self.label}: the answer does not follow the wire format "
                f"({type(exc).__name__}: {exc})",
                kind="bad_response",
                attempts=attempts,
            )
        if failure is not None:
            raise failure
        return Completion(
            text=text,
            usage=Usage(int(tokens_in or 0), int(tokens_out or 0)),
            model=model or self.model,
            provider=self.kind,
            latency_s=latency,
            finish_reason=finish,
            attempts=attempts,
        )
