"""OpenAI's Chat Completions API through the ``openai`` SDK, for OpenAI itself and for any
server that speaks it (vLLM, Ollama, llama.cpp server, SGLang, LM Studio...)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, ClassVar

from klineage.llm._sdk import SdkProvider
from klineage.llm.base import Message, ProviderError

__all__ = ["OpenAICompatibleProvider", "OpenAIProvider"]

LOCAL_PLACEHOLDER_KEY = "EMPTY"  # what local servers expect when they check no key


class OpenAIProvider(SdkProvider):
    """OpenAI models. The key comes from ``api_key=`` or ``OPENAI_API_KEY``; the endpoint from
    ``base_url=``, ``OPENAI_BASE_URL`` or the SDK's default.

    ``max_tokens`` is sent as ``max_completion_tokens`` (the name OpenAI's reasoning models
    require).
    """

    kind: ClassVar[str] = "openai"
    sdk_name: ClassVar[str] = "openai"
    key_env: ClassVar[str | None] = "OPENAI_API_KEY"
    base_url_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    max_tokens_field: ClassVar[str] = "max_completion_tokens"

    def _make_client(self, sdk: ModuleType, api_key: str) -> Any:
        return sdk.OpenAI(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,  # retries are ours (klineage.llm.base.with_retries)
        )

    def _send(self, client: Any, messages: Sequence[Message], options: dict[str, Any]) -> Any:
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
        }
        for name, value in options.items():
            kwargs[self.max_tokens_field if name == "max_tokens" else name] = value
        return client.chat.completions.create(**kwargs)

    def _read(self, response: Any) -> tuple[str, int, int, str | None, str | None]:
        if not response.choices:
            raise ValueError("the answer has no choices")
        choice = response.choices[0]
        usage = response.usage
        return (
            choice.message.content or "",
            getattr(usage, "prompt_tokens", 0) or 0,
            getattr(usage, "completion_tokens", 0) or 0,
            response.model,
            choice.finish_reason,
        )


class OpenAICompatibleProvider(OpenAIProvider):
    """A self-hosted or third-party server speaking the Chat Completions API.

    The endpoint is required (``base_url=`` or ``OPENAI_BASE_URL``, e.g.
    ``http://localhost:8000/v1`` for vLLM, ``http://localhost:11434/v1`` for Ollama,
    ``http://localhost:8080/v1`` for llama.cpp). The key comes from ``api_key=`` or
    ``KLINEAGE_LLM_API_KEY``, never from ``OPENAI_API_KEY``: an OpenAI key is not sent to
    another server by accident. Servers that check no key get a placeholder. ``max_tokens`` is
    sent under that name, which every compatible server understands. No cost is estimated
    unless ``RunAccounting(prices={"openai-compatible:MODEL": ...})`` names the model.
    """

    kind: ClassVar[str] = "openai-compatible"
    key_env: ClassVar[str | None] = "KLINEAGE_LLM_API_KEY"
    base_url_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    max_tokens_field: ClassVar[str] = "max_tokens"

    def __init__(self, model: str, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        if not self.base_url:
            raise ProviderError(
                f"{self.label}: an OpenAI-compatible server needs a base URL; write the spec "
                "as openai-compatible:MODEL@http://HOST:PORT/v1 or set OPENAI_BASE_URL",
                kind="config",
            )

    def _fallback_key(self) -> str | None:
        return LOCAL_PLACEHOLDER_KEY
