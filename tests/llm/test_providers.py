"""The real anthropic and openai SDK clients against the fake server: answers, retries,
backoff, timeouts, errors, accounting."""

from __future__ import annotations

import pytest

from klineage.llm import Message, Price, ProviderError, RetryPolicy, RunAccounting
from tests.llm.conftest import KEY, WIRES, MakeProvider
from tests.llm.fake_server import Fail, FakeLLMServer, Garbage, Reply, Stall

KINDS = ["anthropic", "openai", "openai-compatible"]
ASK = [Message("system", "Answer briefly."), Message("user", "Say hi.")]


def sent_key(headers: dict[str, str]) -> str:
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")


@pytest.mark.parametrize("kind", KINDS)
def test_good_answer(kind: str, server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.play(Reply("hi there", input_tokens=21, output_tokens=3))
    provider = make_provider(kind)
    answer = provider.complete(ASK, temperature=0.2)
    assert answer.text == "hi there"
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (21, 3)
    assert answer.provider == kind and answer.model == "test-model"
    assert answer.finish_reason in ("end_turn", "stop")
    assert answer.attempts == 1 and not answer.cached and answer.latency_s > 0

    [seen] = server.requests
    assert seen.wire == WIRES[kind]
    assert seen.body["model"] == "test-model" and seen.body["temperature"] == 0.2
    assert sent_key(seen.headers) == KEY
    if kind == "anthropic":
        assert seen.body["system"] == "Answer briefly.\n"[:-1]
        assert seen.body["messages"] == [{"role": "user", "content": "Say hi."}]
        assert seen.body["max_tokens"] == 16000  # required by the Messages API
    else:
        assert seen.body["messages"][0] == {"role": "system", "content": "Answer briefly."}
        assert "max_tokens" not in seen.body and "max_completion_tokens" not in seen.body


@pytest.mark.parametrize(
    ("kind", "field"),
    [
        ("anthropic", "max_tokens"),
        ("openai", "max_completion_tokens"),
        ("openai-compatible", "max_tokens"),
    ],
)
def test_max_tokens_field(
    kind: str, field: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Reply("ok"))
    make_provider(kind).complete(ASK, max_tokens=321, stop=["END"])
    body = server.requests[0].body
    assert body[field] == 321
    assert body["stop_sequences" if kind == "anthropic" else "stop"] == ["END"]


def test_unknown_option_is_refused_before_sending(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    with pytest.raises(TypeError, match="unknown option"):
        make_provider("openai").complete(ASK, temprature=0.1)
    with pytest.raises(TypeError, match="seed"):
        make_provider("anthropic").complete(ASK, seed=1)
    assert server.count() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_server_errors_then_success(
    kind: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Fail(500), Fail(503), Reply("finally"))
    waits: list[float] = []
    provider = make_provider(kind, sleep=waits.append)
    answer = provider.complete(ASK)
    assert answer.text == "finally" and answer.attempts == 3
    assert server.count() == 3  # the SDK's own retries are off: every request is ours
    assert waits == [0.001, 0.002]  # exponential backoff (jitter 0 here)
    assert provider.accounting.attempts == 3 and provider.accounting.calls == 1


@pytest.mark.parametrize("kind", KINDS)
def test_server_error_forever(
    kind: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(default=Fail(500, "the fake server is on fire"))
    provider = make_provider(kind)
    with pytest.raises(ProviderError) as info:
        provider.complete(ASK)
    err = info.value
    assert err.kind == "server" and err.status == 500 and err.attempts == 3
    assert "HTTP 500" in str(err) and "on fire" in str(err) and "after 3 attempts" in str(err)
    assert err.__cause__ is None and err.__context__ is None  # no SDK object (or key) chained
    assert server.count() == 3
    assert provider.accounting.failed_calls == 1 and provider.accounting.attempts == 3


@pytest.mark.parametrize("kind", KINDS)
def test_rate_limit_honours_retry_after(
    kind: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Fail(429, "slow down", headers={"retry-after": "0.3"}), Reply("ok"))
    answer = make_provider(kind).complete(ASK)  # base delay is 1 ms: the wait is the server's
    assert answer.text == "ok" and answer.attempts == 2
    assert server.count() == 2
    first, second = server.requests
    assert second.at - first.at >= 0.3


def test_rate_limit_retry_after_ms(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.play(Fail(429, headers={"retry-after-ms": "40"}), Reply("ok"))
    waits: list[float] = []
    make_provider("anthropic", sleep=waits.append).complete(ASK)
    assert waits == [pytest.approx(0.04)]


def test_retry_after_longer_than_the_policy_allows_fails_at_once(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(default=Fail(429, "quota exhausted", headers={"retry-after": "3600"}))
    with pytest.raises(ProviderError) as info:
        make_provider("openai").complete(ASK)
    assert info.value.kind == "rate_limit" and server.count() == 1
    assert "asked to wait 3600 s" in str(info.value)


STALL_S = 600.0
"""How long the server holds a request: far past the client's 0.3 s, so a client that waited
it out would get an answer ("late answer") instead of raising."""


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_timeout(kind: str, server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.play(default=Stall(STALL_S))
    provider = make_provider(
        kind, timeout_s=0.3, retry=RetryPolicy(max_attempts=2, base_delay_s=0.001, jitter=0)
    )
    with pytest.raises(ProviderError) as info:
        provider.complete(ASK)
    err = info.value
    assert err.kind == "timeout" and err.retryable and not err.fatal and err.attempts == 2
    assert "no answer within 0.3 s" in str(err) and "after 2 attempts" in str(err)
    # the timeout fired on both attempts: the client hung up on each stalled request (the
    # server saw the connection close before it answered), whatever the machine's load
    assert server.count() == 2
    assert server.abandoned_requests(2) == 2


@pytest.mark.parametrize(
    ("status", "kind", "fatal"),
    [(400, "bad_request", False), (401, "auth", True), (404, "not_found", True)],
)
def test_client_errors_are_not_retried(
    status: int, kind: str, fatal: bool, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(default=Fail(status, "nope"))
    with pytest.raises(ProviderError) as info:
        make_provider("anthropic").complete(ASK)
    assert info.value.kind == kind and info.value.fatal is fatal
    assert server.count() == 1


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_answer_off_the_wire_format(
    kind: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Garbage())
    with pytest.raises(ProviderError) as info:
        make_provider(kind).complete(ASK)
    assert info.value.kind == "bad_response" and server.count() == 1


def test_connection_refused_is_retried_then_reported(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    closed = FakeLLMServer().start()
    url = closed.url
    closed.stop()
    provider = make_provider("openai", base_url=f"{url}/v1")
    with pytest.raises(ProviderError) as info:
        provider.complete(ASK)
    assert info.value.kind == "connection" and info.value.attempts == 3
    assert f"cannot connect to {url}/v1" in str(info.value)


def test_accounting_sums_tokens_and_estimates_cost(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    run = RunAccounting()
    haiku = make_provider("anthropic", model="claude-haiku-4-5", accounting=run)
    local = make_provider("openai-compatible", model="qwen2.5-coder:7b", accounting=run)
    server.play(
        Reply("a", input_tokens=1000, output_tokens=100),
        Reply("b", input_tokens=2000, output_tokens=300),
        Reply("c", input_tokens=50, output_tokens=5),
        Fail(400),
    )
    haiku.complete(ASK)
    haiku.complete(ASK)
    local.complete(ASK)
    with pytest.raises(ProviderError):
        local.complete(ASK)
    assert (run.calls, run.failed_calls, run.attempts) == (3, 1, 4)
    assert (run.usage.input_tokens, run.usage.output_tokens) == (3050, 405)
    # claude-haiku-4-5: $1 / $5 per million tokens; the local model has no price
    assert run.cost_usd == pytest.approx((3000 * 1 + 400 * 5) / 1e6)
    assert run.unpriced_models == ["openai-compatible:qwen2.5-coder:7b"]
    summary = run.summary()
    assert summary["by_model"]["anthropic:claude-haiku-4-5"]["calls"] == 2
    assert summary["by_model"]["openai-compatible:qwen2.5-coder:7b"]["cost_usd"] is None
    assert summary["input_tokens"] == 3050 and summary["failed_calls"] == 1


def test_price_table_matching() -> None:
    default = RunAccounting()
    assert default.price_for("openai", "gpt-4o-mini-2024-07-18") == Price(0.15, 0.6)
    assert default.price_for("anthropic", "claude-sonnet-4-20250514") == Price(3.0, 15.0)
    assert default.price_for("anthropic", "claude-opus-4-8") is None  # not guessed
    assert default.price_for("openai", "gpt-4o-mini-search-preview") is None
    assert default.price_for("openai-compatible", "gpt-4o") is None  # a local name says nothing
    custom = RunAccounting(
        prices={"openai-compatible:qwen*": Price(1.0, 2.0), "claude-*": (0.0, 0.0)}
    )
    assert custom.price_for("openai-compatible", "qwen2.5-coder:7b") == Price(1.0, 2.0)
    assert custom.price_for("openai", "qwen2.5-coder:7b") is None  # scoped to one kind
    assert custom.price_for("anthropic", "claude-haiku-4-5") == Price(1.0, 5.0)  # exact wins
    assert custom.price_for("anthropic", "claude-opus-4-8") == Price(0.0, 0.0)


def test_retry_policy_delays() -> None:
    import random

    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=5.0, jitter=0.5)
    rng = random.Random(1)
    delays = [policy.delay(n, rng=rng) for n in range(1, 6)]
    for n, d in enumerate(delays, start=1):
        base = min(5.0, 2.0 ** (n - 1))
        assert base <= d <= base * 1.5
    assert policy.delay(1, retry_after=7.0) == 7.0  # never less than the server asks
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
