"""The fake server proposes removals for a real kernel; the real build stage compiles them."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.gate.build import Builder, BuildStatus
from klineage.llm import Proposal, Rejection, ResponseCache, build_proposal, propose_removal
from tests.llm.answers import answer, broken_source, kernel, problem
from tests.llm.conftest import MakeProvider
from tests.llm.fake_server import FakeLLMServer, Reply

pytestmark = pytest.mark.nvcc


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
def test_proposed_removal_compiles(
    kind: str,
    server: FakeLLMServer,
    make_provider: MakeProvider,
    tmp_path: Path,
    shared_builder: Builder,
) -> None:
    server.play(Reply(answer()))
    provider = make_provider(kind)
    outcome = propose_removal(
        provider, kernel(), problem(), ["tuned_block_size"], cache=ResponseCache(tmp_path / "llm")
    )
    assert isinstance(outcome, Proposal)
    built = build_proposal(shared_builder, outcome)  # both providers' answers: one build
    assert isinstance(built, Proposal) and built.build is not None
    assert built.build.status is BuildStatus.OK and built.build.library is not None
    assert built.build.library.is_file()
    assert built.to_dict()["build"]["status"] == "OK"
    assert provider.accounting.calls == 1


def test_proposal_that_does_not_compile_is_rejected(
    server: FakeLLMServer, make_provider: MakeProvider, tmp_path: Path
) -> None:
    server.play(Reply(answer(broken_source())))
    outcome = propose_removal(make_provider("openai"), kernel(), problem(), [])
    assert isinstance(outcome, Proposal)  # well-formed: parsing cannot know it won't compile
    rejected = build_proposal(Builder(cache_dir=tmp_path / "build"), outcome)
    assert isinstance(rejected, Rejection) and rejected.stage == "build"
    assert rejected.build is not None and rejected.build.status is BuildStatus.COMPILE_ERROR
    assert rejected.reason.startswith("does not compile")
    assert "n_elems" in rejected.reason and "correct.cu" in rejected.reason
    assert rejected.mechanism == "tuned_block_size" and rejected.answer == outcome.source.text
