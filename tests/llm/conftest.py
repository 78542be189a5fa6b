"""Fixtures for the LLM tests: a fake server on loopback, a clean environment, fast retries."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from klineage.llm import Provider, ResponseCache, RetryPolicy, provider_from_spec
from tests.llm.fake_server import FakeLLMServer

KEY = "sk-test-SECRET123"
"""The fake key every test configures; it must never leak."""

WIRES = {"anthropic": "anthropic", "openai": "openai", "openai-compatible": "openai"}

FAST_RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.001, max_delay_s=0.01, jitter=0.0)

_ENV = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_PROFILE",
    "ANTHROPIC_CUSTOM_HEADERS",
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "OPENAI_ORG_ID",
    "OPENAI_PROJECT_ID",
    "KLINEAGE_LLM_API_KEY",
    "KLINEAGE_LLM_CACHE_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No real key, endpoint or proxy from the machine; SDK config dirs point nowhere."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path / "no-anthropic-config"))
    monkeypatch.setenv("KLINEAGE_LLM_CACHE_DIR", str(tmp_path / "default-llm-cache"))


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


MakeProvider = Callable[..., Provider]


@pytest.fixture
def make_provider(server: FakeLLMServer) -> MakeProvider:
    """``make_provider(kind, model=..., cache=..., **provider kwargs)`` pointed at the fake
    server, with the fake key and tiny backoffs."""

    def make(
        kind: str, model: str = "test-model", cache: ResponseCache | None = None, **kwargs: Any
    ) -> Provider:
        kwargs.setdefault("api_key", KEY)
        kwargs.setdefault("retry", FAST_RETRY)
        kwargs.setdefault("timeout_s", 5.0)
        kwargs.setdefault("rng", random.Random(0))
        spec = f"{kind}:{model}"
        if kind == "openai-compatible":
            spec += f"@{server.base_url('openai')}"
        else:
            kwargs.setdefault("base_url", server.base_url(WIRES[kind]))
        return provider_from_spec(spec, cache=cache, **kwargs)

    return make
