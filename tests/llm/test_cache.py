"""The response cache: hits never reach the server, misses in replay-only mode are clear
errors, entries are atomic and hold no key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.llm import (
    CacheMiss,
    Message,
    ProviderError,
    ResponseCache,
    cache_key,
    provider_from_spec,
)
from tests.llm.conftest import KEY, MakeProvider
from tests.llm.fake_server import Fail, FakeLLMServer, Reply

ASK = [Message("system", "Answer briefly."), Message("user", "Say hi.")]


@pytest.mark.parametrize("kind", ["anthropic", "openai", "openai-compatible"])
def test_second_identical_call_is_served_from_the_cache(
    kind: str, server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    cache = ResponseCache(tmp_path / "llm")
    provider = make_provider(kind, cache=cache)
    server.play(Reply("first", input_tokens=10, output_tokens=2), Reply("second"))
    one = provider.complete(ASK, max_tokens=64)
    two = provider.complete(ASK, max_tokens=64)
    assert server.count() == 1
    assert one.text == two.text == "first"
    assert not one.cached and two.cached and two.attempts == 0 and two.latency_s == 0
    assert two.usage == one.usage  # what the recorded call cost, for the record
    run = provider.accounting
    assert (run.calls, run.cached_calls) == (1, 1)
    assert run.usage.input_tokens == 10  # a cached answer is not billed twice

    provider.complete(ASK, max_tokens=65)  # other options, other key
    assert server.count() == 2


def test_defaults_are_part_of_the_key(tmp_path: Path) -> None:
    a = cache_key("anthropic", "m", ASK, {"max_tokens": 16000})
    assert a == cache_key("anthropic", "m", list(ASK), {"max_tokens": 16000})
    assert a != cache_key("openai", "m", ASK, {"max_tokens": 16000})
    assert a != cache_key("anthropic", "m2", ASK, {"max_tokens": 16000})
    assert a != cache_key("anthropic", "m", ASK[1:], {"max_tokens": 16000})
    assert a != cache_key("anthropic", "m", ASK, {"max_tokens": 16001})


def test_replay_only_miss_is_a_clear_error(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    provider = make_provider("anthropic", cache=ResponseCache(tmp_path, replay_only=True))
    with pytest.raises(CacheMiss) as info:
        provider.complete(ASK)
    err = info.value
    assert isinstance(err, ProviderError) and err.kind == "cache_miss" and err.fatal
    assert "replay-only" in str(err) and "anthropic:test-model" in str(err)
    assert str(tmp_path) in str(err)
    assert server.count() == 0


def test_replay_needs_no_network_key_or_server(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    record = make_provider("openai", cache=ResponseCache(tmp_path))
    server.play(Reply("recorded answer"))
    record.complete(ASK, temperature=0.0)
    server.stop()

    # Another process, later: no key in the environment, the server is gone.
    replay = provider_from_spec(
        "openai:test-model", cache=ResponseCache(tmp_path, replay_only=True)
    )
    answer = replay.complete(ASK, temperature=0.0)
    assert answer.text == "recorded answer" and answer.cached
    with pytest.raises(CacheMiss):
        replay.complete(ASK, temperature=0.5)


def test_entries_are_atomic_and_hold_no_key(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    cache = ResponseCache(tmp_path / "llm")
    provider = make_provider("anthropic", cache=cache)
    server.play(Reply("int main() {}"))
    provider.complete([Message("user", f"my key is {KEY}, keep it safe")])
    files = [p for p in (tmp_path / "llm").rglob("*") if p.is_file()]
    assert len(files) == 1 and files[0].suffix == ".json"  # no temporary file left behind
    text = files[0].read_text()
    assert KEY not in text
    entry = json.loads(text)
    assert entry["key"] == files[0].stem and files[0].parent.name == entry["key"][:2]
    assert entry["request"]["model"] == "test-model"
    assert entry["request"]["options"] == {"max_tokens": 16000}
    assert entry["completion"]["text"] == "int main() {}"


def test_damaged_entry_counts_as_a_miss(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    cache = ResponseCache(tmp_path)
    provider = make_provider("openai", cache=cache)
    server.play(Reply("one"), Reply("two"))
    provider.complete(ASK)
    [entry] = list(tmp_path.rglob("*.json"))
    entry.write_text("{not json")
    assert provider.complete(ASK).text == "two"
    assert server.count() == 2
    assert json.loads(entry.read_text())["completion"]["text"] == "two"


def test_failures_are_not_cached(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    provider = make_provider("openai", cache=ResponseCache(tmp_path))
    server.play(Fail(500), Fail(500), Fail(500), Reply("ok"))
    with pytest.raises(ProviderError):
        provider.complete(ASK)
    assert provider.complete(ASK).text == "ok"
    assert provider.complete(ASK).cached  # the success was recorded
    assert server.count() == 4


def test_default_directory_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KLINEAGE_LLM_CACHE_DIR", str(tmp_path / "here"))
    assert ResponseCache().directory == tmp_path / "here"
    monkeypatch.delenv("KLINEAGE_LLM_CACHE_DIR")
    assert ResponseCache().directory == Path.home() / ".cache" / "klineage" / "llm"
