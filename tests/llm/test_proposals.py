"""Prompts in, proposals or rejections out: strict parsing, and the provider-driven flows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from klineage.llm import (
    CacheMiss,
    Proposal,
    ProviderError,
    Rejection,
    ResponseCache,
    RetryPolicy,
    materialize_skill,
    parse_prose_answer,
    parse_source_answer,
    propose_removal,
    write_skill_prose,
)
from tests.llm import answers
from tests.llm.answers import PROSE, answer, kernel, problem, simplified_source
from tests.llm.conftest import MakeProvider
from tests.llm.fake_server import Fail, FakeLLMServer, Reply, Stall

ORIGINAL = answers.KERNEL_FILE.read_text()

# ------------------------------------------------------------------------------ parsing


def test_parse_a_good_answer() -> None:
    parsed = parse_source_answer(answer(), original=ORIGINAL)
    assert parsed.mechanism == "tuned_block_size"
    assert parsed.intent == "use a plain 128-thread block instead of the tuned 256"
    assert parsed.source == simplified_source()


@pytest.mark.parametrize("language", ["cuda", "cu", "c++", "cpp", "CUDA"])
def test_parse_accepts_cuda_like_tags(language: str) -> None:
    assert parse_source_answer(answer(language=language)).source == simplified_source()


def test_parse_tolerates_crlf_and_fields_after_the_code() -> None:
    text = f"```cuda\n{simplified_source()}```\nMECHANISM: x\nINTENT: y\n".replace("\n", "\r\n")
    parsed = parse_source_answer(text)
    assert (parsed.mechanism, parsed.intent) == ("x", "y")


def _two_blocks() -> str:
    return answer() + "\n```cuda\n// another\n```\n"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "the answer is empty"),
        ("MECHANISM: x\nINTENT: y\nno code at all", "no fenced code block"),
        (_two_blocks(), "2 fenced code blocks"),
        (answer(language="python"), "tagged 'python'"),
        (answer(language=""), "tagged no language"),
        (answer(mechanism=None), "missing the line 'MECHANISM: ...'"),
        (answer(intent=None), "missing the line 'INTENT: ...'"),
        (answer(intent=""), "the line 'INTENT:' is empty"),
        ("MECHANISM: a\n" + answer(), "'MECHANISM: ...' appears 2 times"),
        (answer(mechanism="x" * 200), "is not a short name"),
        (answer(mechanism="rm -rf; $(x)"), "is not a short name"),
        (answer().rsplit("```", 1)[0], "never closed"),
        (answer(source="__global__ void k() {}\n"), 'does not export extern "C" int run'),
        (answer(source=ORIGINAL), "same as the input kernel"),
        (answer(source=ORIGINAL.replace("\n", "  \r\n")), "same as the input kernel"),
        ("NOT APPLICABLE: it is already naive", "the model declined: it is already naive"),
    ],
)
def test_parse_rejects_malformed_answers(text: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_source_answer(text, original=ORIGINAL)
    assert reason in str(info.value)


def test_fields_inside_the_code_do_not_count() -> None:
    code = "// MECHANISM: sneaky\n// INTENT: sneaky\n" + simplified_source()
    with pytest.raises(ValueError, match="missing the line 'MECHANISM"):
        parse_source_answer(answer(code, mechanism=None, intent=None))


def test_parse_prose() -> None:
    assert parse_prose_answer(PROSE) == PROSE
    assert parse_prose_answer(f"```markdown\n{PROSE}```") == PROSE
    for bad, reason in [
        ("", "empty"),
        (PROSE.replace("## Risks", "## Dangers"), "'## Risks' appears 0 times"),
        (PROSE + "\n## How\nagain\n", "'## How' appears 2 times"),
        ("Sure! Here it is.\n\n" + PROSE, "text before the first section"),
        (
            PROSE.replace("## How", "## Tmp")
            .replace("## Risks", "## How")
            .replace("## Tmp", "## Risks"),
            "out of order",
        ),
        (PROSE + "\n```cuda\nunclosed\n", "never closed"),
        (PROSE + "x" * 9000, "at most"),
    ]:
        with pytest.raises(ValueError) as info:
            parse_prose_answer(bad)
        assert reason in str(info.value), (reason, str(info.value))


# ------------------------------------------------------------------------------ asking


@dataclass
class Detected:
    """Shaped like a klineage.mechanisms Site."""

    mechanism: str
    snippet: str = ""
    start_line: int = 0
    function: str = ""


def test_propose_removal_good_answer(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.play(Reply(answer(), input_tokens=900, output_tokens=300))
    provider = make_provider("openai")
    detected = [
        "vectorized_loads",
        Detected("int64_indexing", "int64_t i = blockIdx.x * (int64_t)blockDim.x", 6, "scale"),
        Detected("int64_indexing", "int64_t n = rows * cols;", 11, "run"),
        {"name": "tuned_block_size", "intent": "256 threads", "snippet": "scale<<<...>>>"},
    ]
    outcome = propose_removal(provider, kernel(), problem(), detected)
    assert isinstance(outcome, Proposal) and outcome.ok
    assert outcome.mechanism == "tuned_block_size" and outcome.task == "remove"
    assert outcome.source.text == simplified_source() and outcome.source.name == "correct.cu"
    assert outcome.origin == "llm:openai:test-model"
    assert outcome.parent == kernel().fingerprint
    assert outcome.usage.output_tokens == 300 and outcome.build is None

    [seen] = server.requests
    system, user = seen.body["messages"]
    assert system["role"] == "system" and "exactly one" in system["content"]
    prompt = user["content"]
    assert ORIGINAL.rstrip() in prompt  # the kernel, whole
    assert (
        'extern "C" int run(const float* x, float alpha, float* y, int64_t rows, int64_t cols, '
        "cudaStream_t stream);" in prompt
    )
    assert "scale_rows_f32" in prompt and "def run(x, alpha):" in prompt
    assert "rows=128 cols=256" in prompt  # workload sizes
    assert "- vectorized_loads\n- int64_indexing\n" in prompt  # one bullet per mechanism
    assert "  - line 6 in scale: `int64_t i = blockIdx.x * (int64_t)blockDim.x`" in prompt
    assert "  - line 11 in run: `int64_t n = rows * cols;`" in prompt
    assert "- tuned_block_size: 256 threads\n  - at: `scale<<<...>>>`" in prompt
    assert "MECHANISM: <" in prompt and "INTENT: <" in prompt
    assert "$" not in prompt  # every placeholder was filled
    assert outcome.to_dict()["fingerprint"] == outcome.source.fingerprint


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("I cannot help with that.", "no fenced code block"),
        (_two_blocks(), "2 fenced code blocks"),
        (answer(mechanism=None), "missing the line 'MECHANISM"),
    ],
)
def test_malformed_answer_is_a_recorded_rejection(
    text: str, reason: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Reply(text, output_tokens=77))
    outcome = propose_removal(make_provider("anthropic"), kernel(), problem(), [])
    assert isinstance(outcome, Rejection) and not outcome.ok
    assert outcome.stage == "parse" and reason in outcome.reason
    assert outcome.answer == text and outcome.usage.output_tokens == 77
    assert outcome.origin == "llm:anthropic:test-model"
    assert outcome.to_dict()["reason"] == outcome.reason


def test_rejection_keeps_the_named_mechanism(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Reply(answer(language="python")))
    outcome = propose_removal(make_provider("openai"), kernel(), problem(), [])
    assert isinstance(outcome, Rejection) and outcome.mechanism == "tuned_block_size"


@pytest.mark.parametrize(("kind", "reason"), [("anthropic", "max_tokens"), ("openai", "length")])
def test_truncated_answer_is_rejected(
    kind: str, reason: str, server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(Reply(answer(), finish_reason=reason))
    outcome = propose_removal(make_provider(kind), kernel(), problem(), [])
    assert isinstance(outcome, Rejection) and "cut off" in outcome.reason


def test_provider_timeout_is_a_recorded_rejection(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(default=Stall(3.0))
    provider = make_provider(
        "openai", timeout_s=0.25, retry=RetryPolicy(max_attempts=2, base_delay_s=0.001)
    )
    outcome = propose_removal(provider, kernel(), problem(), [])
    assert isinstance(outcome, Rejection) and outcome.stage == "provider"
    assert "no answer within 0.25 s" in outcome.reason and "after 2 attempts" in outcome.reason
    assert provider.accounting.failed_calls == 1


def test_server_errors_are_a_recorded_rejection(
    server: FakeLLMServer, make_provider: MakeProvider
) -> None:
    server.play(default=Fail(500, "overloaded"))
    outcome = propose_removal(make_provider("anthropic"), kernel(), problem(), [])
    assert isinstance(outcome, Rejection) and "HTTP 500" in outcome.reason
    assert server.count() == 3


def test_fatal_provider_errors_raise(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    server.play(default=Fail(401, "bad key"))
    with pytest.raises(ProviderError) as info:
        propose_removal(make_provider("openai"), kernel(), problem(), [])
    assert info.value.kind == "auth"


def test_proposals_are_cached_and_replayed(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    server.play(Reply(answer()))
    provider = make_provider("anthropic")
    first = propose_removal(provider, kernel(), problem(), ["x"], cache=ResponseCache(tmp_path))
    again = propose_removal(provider, kernel(), problem(), ["x"], cache=ResponseCache(tmp_path))
    assert isinstance(first, Proposal) and isinstance(again, Proposal)
    assert again.cached and not first.cached and again.source == first.source
    assert server.count() == 1

    replay = ResponseCache(tmp_path, replay_only=True)
    assert isinstance(propose_removal(provider, kernel(), problem(), ["x"], cache=replay), Proposal)
    with pytest.raises(CacheMiss, match="replay-only"):
        propose_removal(provider, kernel(), problem(), ["y"], cache=replay)
    assert server.count() == 1


def test_materialize_skill(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    card = {
        "id": "elementwise.tuned_block_size",
        "mechanism": "tuned_block_size",
        "intent": "launch 128-thread blocks",
        "conditions": ["AxisDivisible('cols', 4)"],
    }
    server.play(Reply(answer(intent="launch 128-thread blocks")))
    outcome = materialize_skill(make_provider("openai-compatible"), card, kernel(), problem())
    assert isinstance(outcome, Proposal) and outcome.task == "materialize"
    assert outcome.origin == "llm:openai-compatible:test-model"
    prompt = server.requests[0].body["messages"][1]["content"]
    assert '"id": "elementwise.tuned_block_size"' in prompt and "AxisDivisible" in prompt
    assert ORIGINAL.rstrip() in prompt

    server.play(Reply("NOT APPLICABLE: the kernel has no launch to tune"))
    declined = materialize_skill(make_provider("openai"), "# A skill\ntext", kernel(), problem())
    assert isinstance(declined, Rejection) and declined.task == "materialize"
    assert "declined: the kernel has no launch to tune" in declined.reason


def test_write_skill_prose(server: FakeLLMServer, make_provider: MakeProvider) -> None:
    evidence = {"mechanism": "vectorized_loads", "speedup": {"rows=128 cols=256": 1.7}}
    server.play(Reply(PROSE), Reply("Sure!\n\n" + PROSE))
    provider = make_provider("anthropic")
    assert write_skill_prose(provider, evidence) == PROSE
    prompt = server.requests[0].body["messages"][0]["content"]
    assert '"speedup"' in prompt and "## When to apply" in prompt
    bad = write_skill_prose(provider, "some evidence")
    assert isinstance(bad, Rejection) and bad.task == "prose" and bad.stage == "parse"
    assert "text before the first section" in bad.reason
