"""No key in a log record, an exception, a rejection or a cache file, even when the server
echoes it back."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import pytest

from klineage.llm import (
    Message,
    ProviderError,
    Rejection,
    ResponseCache,
    RetryPolicy,
    propose_removal,
    redact,
)
from klineage.llm.redact import REDACTED, register_secret
from tests.llm.answers import answer, kernel, problem
from tests.llm.conftest import KEY, MakeProvider
from tests.llm.fake_server import Fail, FakeLLMServer, Reply, Stall


def exception_texts(err: BaseException) -> list[str]:
    """str and repr of an exception, its args, and everything chained to it."""
    out: list[str] = []
    seen: set[int] = set()
    stack: list[BaseException | None] = [err]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out += [str(e), repr(e), *map(repr, e.args)]
        stack += [e.__cause__, e.__context__]
    return out


@pytest.mark.parametrize("kind", ["anthropic", "openai", "openai-compatible"])
def test_no_key_anywhere(
    kind: str,
    server: FakeLLMServer,
    make_provider: MakeProvider,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # the SDKs' and httpx's debug logs too
    cache = ResponseCache(tmp_path / "cache")
    provider = make_provider(kind, cache=cache)
    assert KEY not in repr(provider)

    errors: list[BaseException] = []
    # a rate limit echoing the key, then an answer that quotes it
    server.play(Fail(429, "slow down", echo_key=True), Reply(f"{answer()}\n// {KEY}\n"))
    outcome = propose_removal(provider, kernel(), problem(), [f"leaked {KEY}"], cache=cache)
    # a server error echoing the key, until the retries run out
    server.play(default=Fail(500, "oops", echo_key=True))
    failed = propose_removal(provider, kernel(), problem(), ["other"], cache=cache)
    assert isinstance(failed, Rejection) and "HTTP 500" in failed.reason
    # a refused key, echoed
    server.play(default=Fail(401, "who are you", echo_key=True))
    with pytest.raises(ProviderError) as info:
        provider.complete([Message("user", "hello")])
    errors.append(info.value)
    assert REDACTED in str(info.value)  # the echo was there, and was scrubbed
    # a timeout
    server.play(default=Stall(2.0))
    slow = make_provider(kind, timeout_s=0.2, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(ProviderError) as info:
        slow.complete([Message("user", "hello")])
    errors.append(info.value)

    assert all(
        KEY in r.headers.get("authorization", "") + r.headers.get("x-api-key", "")
        for r in server.requests
    )  # the key was really sent
    for err in errors:
        for text in exception_texts(err):
            assert KEY not in text
        assert KEY not in str(pickle.loads(pickle.dumps(err)))
    for result in (outcome, failed):
        assert KEY not in json.dumps(result.to_dict())
    assert KEY not in caplog.text
    for record in caplog.records:
        assert KEY not in record.getMessage()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files
    for file in files:
        assert KEY not in file.read_text(errors="replace")


def test_redact_patterns() -> None:
    register_secret("plain-secret-value")
    text = (
        "key sk-ant-api03-AbC_123-xyz and sk-proj-abcdef123456 and plain-secret-value; "
        "Authorization: Bearer abcdefghijkl; x-api-key: zyxwvu987654; {'api_key': 'qwerty12345'}"
    )
    out = redact(text)
    for secret in (
        "sk-ant-api03",
        "sk-proj",
        "plain-secret",
        "abcdefghijkl",
        "zyxwvu987654",
        "qwerty12345",
    ):
        assert secret not in out
    assert out.count(REDACTED) == 6
    assert redact("int sk-tile = 3; // mask-x", patterns=False) == "int sk-tile = 3; // mask-x"
    assert redact("float mask-ant = 1") == "float mask-ant = 1"  # not a key shape
    register_secret("EMPTY")  # too short to be a secret: a placeholder for local servers
    assert redact("EMPTY") == "EMPTY"
