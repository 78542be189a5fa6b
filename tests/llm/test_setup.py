"""Configuration: provider specs, keys and endpoints from the environment, missing SDKs, and
klineage working as before without any of it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from klineage.llm import (
    AnthropicProvider,
    CachedProvider,
    Message,
    OpenAICompatibleProvider,
    OpenAIProvider,
    ProviderError,
    ResponseCache,
    parse_spec,
    provider_from_spec,
    render,
)
from klineage.llm.templates import PROMPT_NAMES, TemplateError, template_text
from tests.conftest import REPO
from tests.llm.conftest import KEY
from tests.llm.fake_server import FakeLLMServer, Reply

ASK = [Message("user", "hi")]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("anthropic:claude-haiku-4-5", ("anthropic", "claude-haiku-4-5", None)),
        ("openai:gpt-4.1-mini", ("openai", "gpt-4.1-mini", None)),
        (
            "openai-compatible:Qwen/Qwen2.5-Coder-32B-Instruct@http://localhost:8000/v1",
            ("openai-compatible", "Qwen/Qwen2.5-Coder-32B-Instruct", "http://localhost:8000/v1"),
        ),
        (
            "openai-compatible:qwen2.5-coder:32b@http://127.0.0.1:11434/v1",
            ("openai-compatible", "qwen2.5-coder:32b", "http://127.0.0.1:11434/v1"),
        ),
        ("openai-compatible:org/model@v2", ("openai-compatible", "org/model@v2", None)),
    ],
)
def test_parse_spec(spec: str, expected: tuple[str, str, str | None]) -> None:
    assert parse_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("claude-haiku", "bad provider spec"),
        ("gemini:pro", "bad provider spec"),
        ("openai:", "no model"),
        ("openai-compatible:m@ftp://host", "http:// or https://"),
        ("openai-compatible:m", "needs a base URL"),
    ],
)
def test_bad_specs(spec: str, message: str) -> None:
    with pytest.raises(ProviderError, match=message) as info:
        provider_from_spec(spec)
    assert info.value.kind == "config" and info.value.fatal


def test_spec_builds_the_right_provider(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert isinstance(provider_from_spec("anthropic:m"), AnthropicProvider)
    assert isinstance(provider_from_spec("openai:m"), OpenAIProvider)
    local = provider_from_spec("openai-compatible:m@http://127.0.0.1:9/v1")
    assert isinstance(local, OpenAICompatibleProvider) and local.base_url.endswith(":9/v1")
    cached = provider_from_spec("openai:m", cache=ResponseCache(tmp_path))
    assert isinstance(cached, CachedProvider) and cached.kind == "openai"


def test_missing_key_is_a_clear_error_at_the_first_call() -> None:
    provider = provider_from_spec("anthropic:claude-haiku-4-5")  # constructing needs no key
    with pytest.raises(ProviderError, match="no API key; set ANTHROPIC_API_KEY") as info:
        provider.complete(ASK)
    assert info.value.kind == "config" and info.value.fatal
    with pytest.raises(ProviderError, match="set OPENAI_API_KEY"):
        provider_from_spec("openai:gpt-4o").ensure_ready()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_key_and_endpoint_from_the_environment(
    kind: str, monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    prefix = kind.upper()
    monkeypatch.setenv(f"{prefix}_API_KEY", KEY)
    monkeypatch.setenv(f"{prefix}_BASE_URL", server.base_url(kind))
    server.play(Reply("from env"))
    assert provider_from_spec(f"{kind}:m").complete(ASK).text == "from env"
    headers = server.requests[0].headers
    assert KEY in headers.get("authorization", "") + headers.get("x-api-key", "")


def test_an_openai_key_is_never_sent_to_another_server(
    monkeypatch: pytest.MonkeyPatch, server: FakeLLMServer
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real-openai-key-999")
    server.play(Reply("a"), Reply("b"))
    spec = f"openai-compatible:llama@{server.base_url('openai')}"
    provider_from_spec(spec).complete(ASK)
    assert server.requests[0].headers["authorization"] == "Bearer EMPTY"
    monkeypatch.setenv("KLINEAGE_LLM_API_KEY", KEY)
    provider_from_spec(spec).complete(ASK)
    assert server.requests[1].headers["authorization"] == f"Bearer {KEY}"


def test_missing_sdk_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)  # import anthropic -> ImportError
    provider = provider_from_spec("anthropic:m", api_key=KEY)
    with pytest.raises(ProviderError, match=r"pip install 'klineage\[llm\]'") as info:
        provider.complete(ASK)
    assert info.value.kind == "dependency"


def test_klineage_imports_no_sdk() -> None:
    code = (
        "import sys, klineage, klineage.llm, klineage.llm.proposals\n"
        "p = klineage.llm.provider_from_spec('anthropic:m')\n"
        "bad = [m for m in ('anthropic', 'openai', 'httpx', 'httpx2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def test_prompt_templates_are_package_data_and_strict() -> None:
    for name in PROMPT_NAMES:
        assert "<!-- user -->" in template_text(name)
    messages = render("skill_prose", evidence="E")
    assert [m.role for m in messages] == ["system", "user"]
    assert "E" in messages[1].content and "Prompt:" not in messages[0].content  # header dropped
    with pytest.raises(TemplateError, match="needs a value for: evidence"):
        render("skill_prose")
    with pytest.raises(TemplateError, match="no placeholder for: extra"):
        render("skill_prose", evidence="E", extra="x")
    with pytest.raises(TemplateError, match="no prompt template"):
        render("nope")
    # a value holding '$' is taken literally (kernels may contain it in inline asm)
    assert "$x ${y}" in render("skill_prose", evidence="$x ${y}")[1].content
