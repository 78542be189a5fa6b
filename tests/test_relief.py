"""A profiled target that leaves a skill nothing to relieve puts it last. The profiles are the
H200's, of two naive held-out kernels as the audited replay profiled them
(tests/fixtures/profiles/: sgemm at 98% achieved occupancy, row_sum at 12%); the skills are
the committed library's, with the counter deltas the H200 recorded when they were mined."""

from __future__ import annotations

import json

import pytest

from klineage.gate.profile import Profile
from klineage.mechanisms import get
from klineage.problem import load_problem
from klineage.replay.relief import nothing_to_relieve
from klineage.replay.retrieve import retrieve
from klineage.skills import Measured, SkillLibrary
from tests.conftest import FIXTURES, REPO


def recorded(name: str) -> Profile:
    """A naive held-out kernel's profile as the H200 recorded it in the audited replay."""
    return Profile.model_validate(json.loads((FIXTURES / "profiles" / f"{name}.json").read_text()))


@pytest.fixture(scope="module")
def library() -> SkillLibrary:
    return SkillLibrary.load(REPO / "skills_out")


def test_a_gemm_that_fills_the_gpu_puts_the_block_per_row_skills_last(
    library: SkillLibrary,
) -> None:
    problem = load_problem(REPO / "heldout" / "sgemm")
    plain = retrieve(library, problem)
    # without a profile, the 33-117x block-per-row steps of the row kernels would lead; the
    # launch (a thread per output, m x n) already fills the GPU, so they go last, with split_k
    by_gain = sorted(plain.ranked, key=lambda r: -r.score)
    assert by_gain[0].mechanism == "block_per_row"
    threads = {r.mechanism for r in plain.ranked if "launches m * n" in r.unrelieved}
    assert threads == {"block_per_row", "warp_per_row", "split_k"}
    assert plain.ranked[0].mechanism not in threads
    profiled = retrieve(library, problem, profile=recorded("sgemm_naive"))
    demoted = [r for r in profiled.ranked if r.unrelieved]
    assert {r.mechanism for r in demoted} >= {"block_per_row"}
    block = next(r for r in demoted if r.mechanism == "block_per_row")
    # 98% occupancy and 2.5 sectors a request here; 25% -> 93-95% and 24-32 -> 2-4 there
    assert "achieved occupancy (%) 98.5 here, 25 -> 9" in block.unrelieved
    assert "sectors per global load request 2.5 here" in block.unrelieved
    # one warp per row coalesced 32 sectors a request to 2 on its expert: sgemm's 2.5 is near
    warp = next(r for r in demoted if r.mechanism == "warp_per_row")
    assert "sectors per global load request 2.5 here, 32 -> 2 on its expert" in warp.unrelieved
    # every skill with something left to relieve comes first, in the order it had
    hopeful = [r.skill for r in profiled.ranked if not r.unrelieved]
    assert [r.skill for r in profiled.ranked[: len(hopeful)]] == hopeful
    assert hopeful == [r.skill for r in plain.ranked if r.skill in set(hopeful)]
    # put last, not dropped: nothing leaves the ranking
    assert len(profiled.ranked) == len(plain.ranked)


def test_a_row_kernel_that_leaves_the_gpu_idle_keeps_them_first(library: SkillLibrary) -> None:
    problem = load_problem(REPO / "heldout" / "row_sum")
    profile = recorded("row_sum_naive")
    assert profile.launches[0].achieved_occupancy_pct == pytest.approx(12.46)
    profiled = retrieve(library, problem, profile=profile)
    assert profiled.ranked[0].mechanism == "block_per_row"
    assert not any(r.unrelieved for r in profiled.ranked if r.mechanism == "block_per_row")


def test_padding_has_nothing_to_relieve_without_bank_conflicts(library: SkillLibrary) -> None:
    padding = next(s for s in library if s.mechanism == "smem_padding")
    rule = get("smem_padding")
    assert rule.relieves == ("shared-memory bank conflicts",)
    quiet = recorded("sgemm_naive")
    assert quiet.total("shared_bank_conflicts") == 0
    reason = nothing_to_relieve(padding, rule, quiet)
    assert reason is not None and "no shared-memory bank conflicts" in reason
    conflicted = quiet.model_copy(deep=True)
    conflicted.launches[0].shared_bank_conflicts = 131072.0
    conflicted.launches[0].achieved_occupancy_pct = 40.0
    assert nothing_to_relieve(padding, rule, conflicted) is None
    # a counter the profile did not report is not a zero: no reason to put it last
    unknown = quiet.model_copy(deep=True)
    unknown.launches[0].shared_bank_conflicts = None
    unknown.launches[0].achieved_occupancy_pct = 40.0
    assert nothing_to_relieve(padding, rule, unknown) is None
    # no profile, or one that was skipped, tells nothing
    assert nothing_to_relieve(padding, rule, None) is None
    assert nothing_to_relieve(padding, rule, Profile.skip("no ncu")) is None


def test_a_step_that_gained_nothing_relieved_nothing(library: SkillLibrary) -> None:
    block = next(s for s in library if s.mechanism == "block_per_row")
    busy = recorded("sgemm_naive")
    assert nothing_to_relieve(block, get("block_per_row"), busy) is not None
    flat = block.model_copy(
        update={"effect": block.effect.model_copy(update={"geomean_speedup": 1.0})}
    )
    assert flat.effect.measured is Measured.NO_GAIN
    assert nothing_to_relieve(flat, get("block_per_row"), busy) is None


# ---------------------------------------------------------------------------------------------
# Threads: a group per row has no idle GPU to fill where the launch already fills it
# ---------------------------------------------------------------------------------------------


def test_a_group_per_row_goes_last_on_a_gemm_and_not_on_a_row_reduction() -> None:
    """The naive GEMMs launch a thread per output (m x n, 524,288 and more on every
    workload); row_sum and gemv launch a thread per row (at most 32,000). A split of each
    thread's sum over blocks (split_k) has no idle GPU to fill on the GEMMs either."""
    from klineage.mechanisms import get
    from klineage.problem import load_problem
    from klineage.replay.relief import RESIDENT_THREADS, enough_threads, launched_rows

    for name, expected in (("sgemm", "m * n"), ("batched_hgemm", "batch * m * n")):
        problem = load_problem(REPO / "heldout" / name)
        kernel = problem.kernel_source()
        rows = launched_rows(kernel, problem)
        assert rows is not None and rows[0] == expected and min(rows[1]) >= RESIDENT_THREADS
        for mechanism in ("block_per_row", "warp_per_row", "split_k"):
            why = enough_threads(get(mechanism), kernel, problem)
            assert why is not None and f"launches {expected} =" in why
        assert enough_threads(get("vectorized_access"), kernel, problem) is None
    for name in ("row_sum", "gemv", "cumsum_rows", "mean_pool"):
        problem = load_problem(REPO / "heldout" / name)
        for mechanism in ("block_per_row", "split_k"):
            assert enough_threads(get(mechanism), problem.kernel_source(), problem) is None


def test_a_row_count_it_cannot_evaluate_tells_nothing() -> None:
    from klineage.replay.relief import _value

    assert _value("(unsigned)(batch * m) * n", {"batch": 2, "m": 3, "n": 4}) == 24
    assert _value("(rows + 7) / 8", {"rows": 9}) == 2
    assert _value("rows * heads", {"rows": 9}) is None  # an axis the workload lacks
    assert _value("min(rows, 4)", {"rows": 9}) is None  # a call
