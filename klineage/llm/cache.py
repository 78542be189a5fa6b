"""A content-addressed cache of LLM answers, so that a run can be replayed without the network.

The key is the sha256 of the provider kind, the model, the messages and the generation options
(defaults filled in): the same question to the same model gets the same answer back. Timeouts,
retry policies and base URLs are not part of the key (they do not change what is asked)::

    <dir>/<key[:2]>/<key>.json    {"schema", "key", "request": {...}, "completion": {...}}

Writes are atomic (a temporary file in the same folder, then a rename). Known keys are scrubbed
from everything written. In ``replay_only`` mode a miss raises :class:`CacheMiss` instead of
calling out.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from klineage.llm.base import (
    Completion,
    Message,
    Provider,
    ProviderError,
    RunAccounting,
    normalize_options,
)
from klineage.llm.redact import redact

__all__ = ["CacheMiss", "CachedProvider", "ResponseCache", "cache_key", "default_cache_dir"]

log = logging.getLogger("klineage.llm")

CACHE_SCHEMA = 1  # bump when the key recipe or the entry layout changes


def default_cache_dir() -> Path:
    """``$KLINEAGE_LLM_CACHE_DIR`` if set, else ``~/.cache/klineage/llm``."""
    env = os.environ.get("KLINEAGE_LLM_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "klineage" / "llm"


class CacheMiss(ProviderError):
    """Replay-only mode and no recorded answer for this request."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="cache_miss")

    def __reduce__(self) -> tuple[Any, ...]:
        return (CacheMiss, (self.message,))


def _request(
    kind: str, model: str, messages: Sequence[Message], options: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "schema": CACHE_SCHEMA,
        "provider": kind,
        "model": model,
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "options": dict(sorted(options.items())),
    }


def cache_key(
    kind: str, model: str, messages: Sequence[Message], options: Mapping[str, Any]
) -> str:
    """sha256 hex of the canonical JSON of (kind, model, messages, options)."""
    blob = json.dumps(
        _request(kind, model, messages, options),
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class ResponseCache:
    """Answers on disk, keyed by :func:`cache_key`."""

    def __init__(self, directory: str | Path | None = None, *, replay_only: bool = False) -> None:
        self.directory = Path(directory).expanduser() if directory else default_cache_dir()
        self.replay_only = replay_only

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.directory)!r}, replay_only={self.replay_only})"

    def path(self, key: str) -> Path:
        """Where the answer with cache key `key` is stored."""
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> Completion | None:
        """The recorded answer, or None (a damaged entry counts as missing)."""
        path = self.path(key)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("schema") != CACHE_SCHEMA or data.get("key") != key:
                raise ValueError("schema or key mismatch")
            return Completion.from_dict(data["completion"])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as err:
            log.warning("LLM cache entry %s is unreadable (%s); ignoring it", path, err)
            return None

    def put(
        self,
        key: str,
        kind: str,
        model: str,
        messages: Sequence[Message],
        options: Mapping[str, Any],
        completion: Completion,
    ) -> Path:
        """Record an answer atomically; returns the entry's path."""
        entry = {
            "schema": CACHE_SCHEMA,
            "key": key,
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "request": _request(kind, model, messages, options),
            "completion": {**completion.to_dict(), "cached": False},
        }
        # Only the configured keys are scrubbed: key-shaped patterns could corrupt kernel text.
        text = redact(json.dumps(entry, indent=1, ensure_ascii=False), patterns=False)
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def wrap(self, provider: Provider) -> CachedProvider:
        """``provider`` answering from this cache first."""
        return CachedProvider(provider, self)


class CachedProvider:
    """A provider that answers from a :class:`ResponseCache` and records what it fetches."""

    def __init__(self, inner: Provider, cache: ResponseCache) -> None:
        if isinstance(inner, CachedProvider):
            inner = inner.inner
        self.inner: Provider = inner
        self.cache = cache

    @property
    def kind(self) -> str:
        """The wrapped provider's kind (the cache key depends on it)."""
        return self.inner.kind

    @property
    def model(self) -> str:
        """The wrapped provider's model."""
        return self.inner.model

    @property
    def accounting(self) -> RunAccounting:
        """The wrapped provider's accounting: cache hits are added up there too."""
        return self.inner.accounting

    def __repr__(self) -> str:
        return f"CachedProvider({self.inner!r}, {self.cache!r})"

    def complete(self, messages: Sequence[Message], **options: Any) -> Completion:
        """The recorded answer to this conversation and options, or the provider's (kept)."""
        defaults = getattr(self.inner, "default_options", {})
        opts = normalize_options(options, defaults)
        key = cache_key(self.kind, self.model, messages, opts)
        hit = self.cache.get(key)
        if hit is not None:
            completion = replace(hit, cached=True, latency_s=0.0, attempts=0)
            self.accounting.record(completion, requested_model=self.model)
            log.info("%s:%s: answer served from the cache (%s)", self.kind, self.model, key[:16])
            return completion
        if self.cache.replay_only:
            raise CacheMiss(
                f"replay-only: no recorded answer for {self.kind}:{self.model} "
                f"(cache key {key[:16]}...) in {self.cache.directory}; this prompt was never "
                "sent with these options. Run once with the network to record it, or turn "
                "replay-only off."
            )
        completion = self.inner.complete(messages, **opts)
        self.cache.put(key, self.kind, self.model, messages, opts, completion)
        return completion
