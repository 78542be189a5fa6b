"""The `--llm` hooks: LLM-proposed removals while mining and LLM-applied skills in replay, gated
beside the rules' attempts. Real nvcc builds, the labelled stand-in for the GPU stages
(`stand_in_gate.py`) and the fake LLM server on loopback (`tests/llm/fake_server.py`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.cli.llm import open_llm
from klineage.gate.build import Builder
from klineage.gate.log import GateLog
from klineage.kernel import KernelSource
from klineage.lineage import AttemptStatus, LineageGraph
from klineage.llm import CachedProvider, Provider, provider_from_spec
from klineage.mechanisms import Carrier, MechanismRefused, Refusal, all_mechanisms, get
from klineage.mining.extract import NO_LLM_ROUND_TRIP, round_trip, skill_of
from klineage.mining.mine import MineReport
from klineage.mining.removal import apply_everywhere, remove_mechanism
from klineage.mining.walk import MiningBudget, Simplifier
from klineage.problem import load_problem
from klineage.replay.run import ReplayBudget
from klineage.skills import SkillLibrary
from tests.llm.answers import answer
from tests.llm.conftest import _ENV, FAST_RETRY, KEY
from tests.llm.fake_server import Fail, FakeLLMServer, Reply
from tests.mining.stand_in_gate import StandInGate, mine_gated, replay_gated
from tests.mining.test_mine import COST, EXPERT, PROBLEM, _gate

pytestmark = pytest.mark.nvcc

TARGET = PROBLEM.parent / "exp_target"
LINEAGE = Path("lineages") / "exp_scale_f32.json"
EXPERT_SOURCE = (PROBLEM / "kernel.cu").read_text()
MALFORMED = "I would remove the vectorized loads first; shall I go ahead?"
DECLINE = "NOT APPLICABLE: nothing left to change"


def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """No real key, endpoint or proxy from the machine (as tests/llm/conftest.py does)."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp / "no-anthropic-config"))
    monkeypatch.setenv("KLINEAGE_LLM_CACHE_DIR", str(tmp / "default-llm-cache"))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _clean_env(monkeypatch, tmp_path)


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as fake:
        yield fake


def anthropic(server: FakeLLMServer) -> Provider:
    return provider_from_spec(
        "anthropic:test-model",
        api_key=KEY,
        base_url=server.base_url("anthropic"),
        retry=FAST_RETRY,
        timeout_s=5.0,
    )


def rule_removals_at_the_root() -> int:
    expert = KernelSource.from_file(PROBLEM / "kernel.cu")
    return sum(remove_mechanism(expert, m).changed for m in all_mechanisms())


def first_step_only() -> MiningBudget:
    """The expert, every rule removal at the root, and the LLM's: then the budget is spent."""
    return MiningBudget(gate_runs=rule_removals_at_the_root() + 2)


def without_launch_bounds() -> str:
    """The expert with `__launch_bounds__(256)` removed by hand (not as the rule writes it)."""
    text = EXPERT_SOURCE.replace(
        "__global__ void __launch_bounds__(256)\nexp_scale(", "__global__ void exp_scale("
    )
    assert text != EXPERT_SOURCE
    return text


# ------------------------------------------------------------------------------------ mining


@pytest.fixture(scope="module")
def malformed_walk(
    builder: Builder, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, MineReport, int]]:
    """A whole walk where every LLM answer is malformed (and its skills, for replay)."""
    out = tmp_path_factory.mktemp("skills_out")
    with pytest.MonkeyPatch.context() as monkeypatch, FakeLLMServer() as fake:
        _clean_env(monkeypatch, out)
        fake.play(default=Reply(MALFORMED))
        report = mine_gated(PROBLEM, out, gate=_gate(builder), llm=anthropic(fake))
        yield out, report, fake.count()


def test_a_malformed_answer_is_recorded_and_the_walk_is_unaffected(
    malformed_walk: tuple[Path, MineReport, int],
) -> None:
    out, report, requests = malformed_walk
    assert report.termination == "complete" and report.steps == 5 and report.verified == 5
    lineage = LineageGraph.load(out / LINEAGE)
    assert [a.mechanism for a in lineage.main_path()] == sorted(COST, key=COST.get)
    attempts = lineage.attempts()
    assert {a.origin for a in attempts} == {"rule"}
    # the LLM cost no gate run: the expert's, then one per rule attempt
    assert lineage.meta.gate_runs == 1 + len(attempts)
    # asked once per state (the last one, with nothing left for the rules, included)
    rejections = lineage.llm_rejections
    assert requests == len(rejections) == report.llm_rejections == 6
    assert [r.step for r in rejections] == [0, 1, 2, 3, 4, 5]
    assert {r.stage for r in rejections} == {"parse"}
    assert all(r.origin == "llm:anthropic:test-model" for r in rejections)
    assert "no fenced code block" in rejections[0].reason
    assert rejections[0].answer == MALFORMED and rejections[0].input_tokens == 120
    assert lineage.meta.llm == "llm:anthropic:test-model"
    assert report.llm_attempts == 0


def test_an_llm_proposed_removal_is_gated_beside_the_rules(
    builder: Builder, server: FakeLLMServer, tmp_path: Path
) -> None:
    intent = "the kernel no longer promises a block size to the compiler"
    server.play(
        Reply(answer(without_launch_bounds(), mechanism="Occupancy hint", intent=intent)),
        default=Reply(DECLINE),
    )
    provider = anthropic(server)
    report = mine_gated(
        PROBLEM, tmp_path, gate=_gate(builder), budget=first_step_only(), llm=provider
    )
    assert report.termination == "budget"
    assert (report.llm_attempts, report.llm_accepted, report.llm_rejections) == (1, 1, 0)
    lineage = LineageGraph.load(tmp_path / LINEAGE)
    at_root = lineage.attempts_from(lineage.root)
    rules = [a for a in at_root if a.origin == "rule"]
    [by_llm] = [a for a in at_root if a.origin != "rule"]
    assert len(rules) == rule_removals_at_the_root() and "launch_bounds" in {
        a.mechanism for a in rules
    }
    assert by_llm.origin == "llm:anthropic:test-model"
    assert by_llm.mechanism == "llm:occupancy_hint" and by_llm.intent == intent
    assert by_llm.status is AttemptStatus.ACCEPTED and by_llm.gate_status == "PASSED"
    assert by_llm.sites == [] and by_llm.carriers == [] and by_llm.step == 0
    assert by_llm.ratio == pytest.approx(1 / COST["launch_bounds"], rel=1e-3)
    # one budget for both origins: every attempt was a gate run
    assert lineage.meta.gate_runs == 1 + len(at_root)
    assert [a.mechanism for a in lineage.main_path()] == ["restrict_pointers"]
    # the prompt showed the kernel and what the catalog detects in it
    sent = json.dumps(server.requests[0].body)
    assert "__launch_bounds__(256)" in sent and "launch_bounds" in sent
    assert provider.accounting.calls == 1

    skill = next(s for s in SkillLibrary.load(tmp_path) if s.origin != "rule")
    assert skill.id.startswith("llm-occupancy_hint--exp_scale_f32--")
    assert skill.mechanism == "llm:occupancy_hint" and skill.intent == intent
    assert skill.verified is None and skill.round_trip_note == NO_LLM_ROUND_TRIP
    assert skill.effect.geomean_speedup == pytest.approx(COST["launch_bounds"], rel=1e-3)
    assert "__launch_bounds__(256)" in skill.anchor.after
    assert any("LLM-proposed" in prose for prose in skill.condition_prose)
    card = (tmp_path / skill.id / "SKILL.md").read_text()
    assert "proposed by llm:anthropic:test-model" in card and "Round trip: not tried" in card

    shown = CliRunner().invoke(
        app, ["lineage", "show", "exp_scale_f32", "--out", str(tmp_path)], env={"COLUMNS": "200"}
    )
    assert shown.exit_code == 0, shown.output
    assert "origin" in shown.output and "llm:anthropic:test-model: 1 attempts" in shown.output


def test_an_answer_that_does_not_compile_is_a_rejected_attempt(
    builder: Builder, server: FakeLLMServer, tmp_path: Path
) -> None:
    broken = without_launch_bounds().replace("alpha, y, rows, cols);", "alpha, y, n_elems);")
    server.play(Reply(answer(broken, mechanism="launch_bounds")), default=Reply(DECLINE))
    report = mine_gated(
        PROBLEM, tmp_path, gate=_gate(builder), budget=first_step_only(), llm=anthropic(server)
    )
    assert report.termination == "budget" and report.steps == 1
    lineage = LineageGraph.load(tmp_path / LINEAGE)
    [by_llm] = [a for a in lineage.attempts() if a.origin != "rule"]
    # a catalog name stays as it is; the id still tells the two launch_bounds attempts apart
    assert by_llm.mechanism == "launch_bounds" and by_llm.id.endswith("-llm-launch_bounds")
    assert by_llm.status is AttemptStatus.REJECTED and by_llm.gate_status == "COMPILE_ERROR"
    assert "n_elems" in by_llm.message
    assert lineage.meta.gate_runs == 1 + len(lineage.attempts())
    library = SkillLibrary.load(tmp_path)
    assert all(s.origin == "rule" for s in library)
    risky = next(s for s in library if s.mechanism == "restrict_pointers")
    assert any(
        r.kind == "rejected_sibling"
        and r.status == "COMPILE_ERROR"
        and r.mechanism == "launch_bounds"
        for r in risky.risks
    )


def test_the_rules_own_removal_is_not_gated_twice(
    builder: Builder, server: FakeLLMServer, tmp_path: Path
) -> None:
    expert = KernelSource.from_file(PROBLEM / "kernel.cu")
    same = remove_mechanism(expert, get("launch_bounds")).simplified.text
    server.play(Reply(answer(same, mechanism="launch_bounds")), default=Reply(DECLINE))
    mine_gated(
        PROBLEM, tmp_path, gate=_gate(builder), budget=first_step_only(), llm=anthropic(server)
    )
    lineage = LineageGraph.load(tmp_path / LINEAGE)
    assert {a.origin for a in lineage.attempts()} == {"rule"}
    duplicate, *later = lineage.llm_rejections  # later states: the model declines
    assert duplicate.stage == "duplicate" and duplicate.step == 0
    assert all(r.stage == "parse" for r in later)
    assert duplicate.reason == "the same kernel as the catalog's removal of launch_bounds"


def test_an_llm_removal_of_a_catalog_mechanism_is_verified_by_its_rule(
    builder: Builder, server: FakeLLMServer, tmp_path: Path
) -> None:
    server.play(Reply(answer(without_launch_bounds(), mechanism="Launch Bounds")))
    problem = load_problem(PROBLEM)
    log = GateLog(tmp_path / "gatelog.jsonl", _gate(builder))
    simplifier = Simplifier(log, llm=anthropic(server), skip_no_ops=False)
    lineage = simplifier.walk(
        problem, KernelSource.from_file(PROBLEM / "kernel.cu"), first_step_only()
    )
    [by_llm] = [a for a in lineage.attempts() if a.origin != "rule"]
    assert by_llm.mechanism == "launch_bounds" and by_llm.status is AttemptStatus.ACCEPTED
    skill = skill_of(problem, lineage, None, by_llm, log)
    assert skill.id.startswith("llm-launch_bounds--") and skill.category == "launch"
    assert {c["kind"] for c in skill.conditions} == {"block_size_at_most"}  # the rule's own
    round_trip(problem, lineage, None, skill, log)
    assert skill.verified is True and skill.round_trip_ratio == pytest.approx(1.0, rel=1e-3)
    assert skill.round_trip_note.startswith("the catalog's rule re-applied to the LLM's state")


def test_a_fatal_provider_error_stops_asking_and_the_walk_goes_on(
    builder: Builder, server: FakeLLMServer, tmp_path: Path
) -> None:
    server.play(default=Fail(401, "invalid x-api-key", echo_key=True))
    budget = MiningBudget(gate_runs=rule_removals_at_the_root() + 5)
    report = mine_gated(
        PROBLEM, tmp_path, gate=_gate(builder), budget=budget, llm=anthropic(server)
    )
    assert report.steps >= 2 and server.count() == 1  # asked once, never again
    lineage = LineageGraph.load(tmp_path / LINEAGE)
    [failure] = lineage.llm_rejections
    assert failure.stage == "provider" and failure.kind == "auth"
    assert "not asked again" in failure.reason and KEY not in json.dumps(lineage.to_json())


# ------------------------------------------------------------------------------------ replay


def _renamed(skill: Any, mechanism: str) -> Any:
    """A copy of `skill` under a mechanism the catalog does not know."""
    return skill.model_copy(
        update={
            "id": skill.id.replace(skill.mechanism, f"llm-{mechanism}"),
            "mechanism": f"llm:{mechanism}",
            "origin": "llm:anthropic:test-model",
        }
    )


def test_replay_asks_the_llm_when_no_rule_applies_a_skill(
    builder: Builder,
    server: FakeLLMServer,
    malformed_walk: tuple[Path, MineReport, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mined = {s.mechanism: s for s in SkillLibrary.load(malformed_walk[0])}
    fast_exp = _renamed(mined["fast_math"], "fast_exp")
    library = SkillLibrary(
        tmp_path / "skills", [fast_exp, mined["readonly_ldg"], mined["restrict_pointers"]]
    )
    library.save()
    # the readonly_ldg rule refuses every site here: the LLM is asked to apply that skill
    ldg = get("readonly_ldg")

    def refuse(kernel: KernelSource, site: Any, carrier: Any = None) -> KernelSource:
        raise MechanismRefused(Refusal(mechanism=ldg.name, action="apply", reason="test refusal"))

    monkeypatch.setattr(ldg, "apply", refuse)
    naive = (TARGET / "kernel.cu").read_text()
    with_expf = naive.replace("expf(x[i])", "__expf(x[i])")
    restrict = get("restrict_pointers")
    with_restrict = apply_everywhere(KernelSource(with_expf), restrict, Carrier()).text
    with_ldg = with_restrict.replace("__expf(x[i])", "__expf(__ldg(&x[i]))")
    # retrieval ranks fast_exp (the largest gain), then restrict_pointers, then readonly_ldg
    server.play(
        Reply(answer(with_expf, mechanism="fast_exp", intent="use the fast exponential")),
        Reply(DECLINE),  # fast_exp again, on the new state: nothing left to do
        Reply(DECLINE),  # and again after restrict_pointers (applied by its rule)
        Reply(answer(with_ldg, mechanism="readonly_ldg", intent="read x through __ldg")),
        default=Reply(DECLINE),
    )
    provider = provider_from_spec(
        f"openai-compatible:test-model@{server.base_url('openai')}",
        api_key=KEY,
        retry=FAST_RETRY,
        timeout_s=5.0,
    )
    gate = StandInGate(
        builder,
        cost={"fast_math": 1.5, "readonly_ldg": 1.1, "restrict_pointers": 1.05},
        expert_mechanisms=EXPERT,
    )
    report = replay_gated(
        [TARGET],
        library.root,
        tmp_path / "replay",
        gate=gate,
        methods=["skills"],
        budget=ReplayBudget(gate_runs=6),
        llm=provider,
    )
    [result] = report.results
    llm = "llm:openai-compatible:test-model"
    origins = [(r.action, r.origin, r.outcome) for r in result.runs]
    assert origins == [
        ("llm:fast_exp", f"{llm}:skill:{fast_exp.id}", "kept"),
        ("restrict_pointers", f"skill:{mined['restrict_pointers'].id}", "kept"),
        ("readonly_ldg", f"{llm}:skill:{mined['readonly_ldg'].id}", "kept"),
    ]
    assert result.speedup == pytest.approx(1.5 * 1.1 * 1.05, rel=0.02)
    assert any("test refusal" in r for r in result.refusals)
    # declined answers are recorded and cost no gate run; a skill a rule applied is not asked
    assert len(result.llm_rejections) == 3 and server.count() == 2 + 3
    assert {r.stage for r in result.llm_rejections} == {"parse"}
    assert {r.skill for r in result.llm_rejections} == {fast_exp.id}
    assert all("the model declined" in r.reason for r in result.llm_rejections)
    assert "llm-fast_exp" in server.requests[0].body["messages"][-1]["content"]  # the card
    assert [u.origin for u in result.skills_used] == [o for _, o, _ in origins]
    assert report.llm == llm and report.llm_usage is not None
    assert report.llm_usage["calls"] == server.count()
    lineage = LineageGraph.load(tmp_path / "replay" / "lineages" / "exp_target_f32.skills.json")
    assert {(a.mechanism, a.origin) for a in lineage.attempts()} == {
        (action, origin) for action, origin, _ in origins
    }
    assert lineage.meta.llm == llm


# --------------------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("command", ["mine", "replay"])
def test_llm_without_a_key_stops_before_any_gate_run(
    command: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_gate(*args: object, **kwargs: object) -> None:
        raise AssertionError("a gate was opened")

    monkeypatch.setattr("klineage.gate.gate.Gate", no_gate)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)  # a key for another provider must not show
    folder = PROBLEM if command == "mine" else TARGET
    args = [command, str(folder), "--llm", "anthropic:claude-haiku-4-5"]
    args += ["--out", str(tmp_path)] if command == "mine" else ["--skills", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "no API key; set ANTHROPIC_API_KEY" in result.output
    assert "api_key=" not in result.output  # Python advice has no place on the command line
    assert KEY not in result.output
    bad = CliRunner().invoke(app, [command, str(folder), "--llm", "gemini:pro"])
    assert bad.exit_code == 2 and "bad provider spec" in bad.output
    alone = CliRunner().invoke(app, [command, str(folder), "--llm-replay-only"])
    assert alone.exit_code == 2 and "need --llm" in alone.output


def test_replay_only_needs_no_key(tmp_path: Path) -> None:
    from rich.console import Console

    provider = open_llm("anthropic:claude-haiku-4-5", tmp_path, True, Console(stderr=True))
    assert isinstance(provider, CachedProvider) and provider.cache.replay_only
