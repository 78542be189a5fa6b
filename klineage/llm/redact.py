"""Keep API keys out of logs, artifacts and exception messages.

Every provider registers the key it was configured with (:func:`register_secret`); every text
that leaves :mod:`klineage.llm` for a log record, an exception or a file on disk goes through
:func:`redact` first. Besides the registered keys, anything shaped like a key is scrubbed:
``sk-...`` and ``sk-ant-...`` tokens, and the values of ``Authorization: Bearer ...`` and
``x-api-key: ...`` headers.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable

__all__ = ["REDACTED", "RedactingFilter", "guard_loggers", "redact", "register_secret"]

REDACTED = "[REDACTED]"

_MIN_SECRET_LENGTH = 6  # shorter "keys" (e.g. "EMPTY" for a local server) are not secrets

_PATTERNS: tuple[re.Pattern[str], ...] = (
    # sk-ant-api03-..., sk-proj-..., sk-...: the shapes of Anthropic and OpenAI keys
    re.compile(r"\bsk-(?:ant-)?[A-Za-z0-9_\-]{4,}"),
    # header values, however they were printed
    re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9_\-.=+/]{6,}"),
    re.compile(r"(?i)(\bx-api-key['\"]?\s*[:=,]\s*['\"]?)[^\s'\",}]{6,}"),
    re.compile(r"(?i)(\bapi[_-]?key['\"]?\s*[:=]\s*['\"]?)[^\s'\",}]{6,}"),
)

_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(secret: str | None) -> None:
    """Remember a configured key so that :func:`redact` scrubs it wherever it appears."""
    if secret and len(secret) >= _MIN_SECRET_LENGTH:
        with _lock:
            _secrets.add(secret)


def _registered() -> list[str]:
    with _lock:
        # longest first, so that a key containing another key is scrubbed whole
        return sorted(_secrets, key=len, reverse=True)


def redact(text: object, extra: Iterable[str] = (), *, patterns: bool = True) -> str:
    """``str(text)`` with every registered key, every ``extra`` secret and (unless
    ``patterns`` is False) every key-shaped token replaced by ``[REDACTED]``.

    Pass ``patterns=False`` for data that must survive intact (cached answers hold kernel
    source, where ``sk-tile`` may be an expression): then only the known keys are scrubbed.
    """
    out = str(text)
    for secret in [*_registered(), *(s for s in extra if s and len(s) >= _MIN_SECRET_LENGTH)]:
        out = out.replace(secret, REDACTED)
    if not patterns:
        return out
    for pattern in _PATTERNS:
        if pattern.groups:
            out = pattern.sub(lambda m: m.group(1) + REDACTED, out)
        else:
            out = pattern.sub(REDACTED, out)
    return out


class RedactingFilter(logging.Filter):
    """A logging filter that scrubs keys from a record's message and traceback text.

    Installed on the loggers of the SDKs and their HTTP stacks by :func:`guard_loggers`, so
    that even their debug logs (which print whole request bodies) cannot carry a key.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken record is the logging module's business, not ours
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True


_guarded: set[str] = set()


def guard_loggers(*packages: str) -> None:
    """Attach a :class:`RedactingFilter` to the loggers of ``packages`` and all their existing
    child loggers (idempotent; call it after importing the packages).

    A filter on a logger sees only the records created on that very logger, so every child
    (``anthropic._base_client``, ``httpcore2.http11``...) needs its own.
    """
    names = [
        name
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger)
        and any(name == p or name.startswith(p + ".") for p in packages)
    ]
    with _lock:
        for name in {*packages, *names}:
            if name not in _guarded:
                logging.getLogger(name).addFilter(RedactingFilter())
                _guarded.add(name)
