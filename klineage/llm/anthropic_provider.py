"""Anthropic's Messages API through the ``anthropic`` SDK."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any, ClassVar

from klineage.llm._sdk import SdkProvider
from klineage.llm.base import Message

__all__ = ["AnthropicProvider"]

DEFAULT_MAX_TOKENS = 16000  # a full kernel rewrite; the Messages API requires a limit


class AnthropicProvider(SdkProvider):
    """Claude models. The key comes from ``api_key=`` or ``ANTHROPIC_API_KEY``; the endpoint
    from ``base_url=``, ``ANTHROPIC_BASE_URL`` or the SDK's default.

    System messages become the request's ``system`` field; ``stop`` becomes
    ``stop_sequences``. ``seed`` is not supported by this API.
    """

    kind: ClassVar[str] = "anthropic"
    sdk_name: ClassVar[str] = "anthropic"
    key_env: ClassVar[str | None] = "ANTHROPIC_API_KEY"
    base_url_env: ClassVar[str | None] = "ANTHROPIC_BASE_URL"
    default_options: ClassVar[Mapping[str, Any]] = {"max_tokens": DEFAULT_MAX_TOKENS}

    def _make_client(self, sdk: ModuleType, api_key: str) -> Any:
        return sdk.Anthropic(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=0,  # retries are ours (klineage.llm.base.with_retries)
        )

    def _check(self, messages: Sequence[Message], options: dict[str, Any]) -> None:
        if "seed" in options:
            raise TypeError("the anthropic provider does not support the seed option")
        turns = [m for m in messages if m.role != "system"]
        if not turns or turns[0].role != "user":
            raise ValueError("the conversation must start with a user message after the system")

    def _send(self, client: Any, messages: Sequence[Message], options: dict[str, Any]) -> Any:
        system = "\n\n".join(m.content for m in messages if m.role == "system")
        turns = [{"role": m.role, "content": m.content} for m in messages if m.role != "system"]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": options["max_tokens"],
        }
        if system:
            kwargs["system"] = system
        # Sampling options travel in the body directly: recent SDKs no longer declare them
        # (recent models refuse them, older ones still take them).
        sampling = {k: options[k] for k in ("temperature", "top_p") if k in options}
        if sampling:
            kwargs["extra_body"] = sampling
        if "stop" in options:
            kwargs["stop_sequences"] = options["stop"]
        return client.messages.create(**kwargs)

    def _read(self, response: Any) -> tuple[str, int, int, str | None, str | None]:
        blocks = response.content
        if not isinstance(blocks, list):
            raise TypeError("content is not a list of blocks")
        text = "".join(b.text for b in blocks if getattr(b, "type", None) == "text")
        usage = response.usage
        return (
            text,
            getattr(usage, "input_tokens", 0) or 0,
            getattr(usage, "output_tokens", 0) or 0,
            response.model,
            response.stop_reason,
        )
