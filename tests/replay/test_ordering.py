"""Sequencing skills on a target (real kernels, real catalog rewrites, the committed skills)."""

from __future__ import annotations

from pathlib import Path

from klineage.gate.log import GateLog
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier
from klineage.mining.removal import apply_everywhere
from klineage.problem import load_problem
from klineage.replay.methods import Materializer
from klineage.replay.ordering import closes, keep_options_open, transfer_carrier
from klineage.skills import SkillLibrary

ROOT = Path(__file__).resolve().parents[2]


def test_vectorizing_first_would_close_block_per_row_on_layernorm() -> None:
    problem = load_problem(ROOT / "heldout" / "layernorm")
    naive = KernelSource.from_file(problem.kernel_path)
    closed = closes(["vectorized_access", "block_per_row"], naive, apply_everywhere)
    assert closed["vectorized_access"] == {"block_per_row"}
    assert closed["block_per_row"] == set()


def test_the_skills_method_tries_block_per_row_before_vectorizing(tmp_path: Path) -> None:
    problem = load_problem(ROOT / "heldout" / "layernorm")
    naive = KernelSource.from_file(problem.kernel_path)
    library = list(SkillLibrary.load(ROOT / "skills_out"))
    materializer = Materializer(GateLog(tmp_path / "log.jsonl", None), library)  # type: ignore[arg-type]
    moves = list(materializer.method("skills", problem).candidates(naive))
    names = [m.name for m in moves]
    assert names[0] == "block_per_row"
    first_vector = next(m for m in moves if m.name == "vectorized_access")
    # the skill's vectors keep their bytes on bfloat16 (float32's 4-wide become 8-wide)
    skill = next(s for s in library if s.id == first_vector.skill)
    learned = skill.carrier["vector_width"]
    assert learned is not None and first_vector.carrier.vector_width is not None
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[skill.scope.dtypes[0]]
    assert first_vector.carrier.vector_width * 2 == learned * size


def test_a_cycle_keeps_rank_order() -> None:
    ranked = ["a1", "b1", "a2"]
    closed = {"a": {"b"}, "b": {"a"}}
    assert keep_options_open(ranked, lambda item: item[0], closed) == ["a1", "b1", "a2"]
    one_way = {"a": {"b"}}
    assert keep_options_open(ranked, lambda item: item[0], one_way) == ["b1", "a1", "a2"]


def test_what_a_skill_would_close_is_pulled_forward_and_nothing_else() -> None:
    # gemv after a warp per row: vectors (best-ranked) would close the unrolled loop and the
    # staged row; those two go first, then the vectors, then what ranked below them
    ranked = ["vec1", "restrict1", "bounds1", "unroll1", "staging1", "vec2"]
    closed = {"vec": {"unroll", "staging"}}
    ordered = keep_options_open(ranked, lambda item: item[:-1], closed)
    assert ordered == ["unroll1", "staging1", "vec1", "restrict1", "bounds1", "vec2"]
    # as replays before 2026-12-06 ran: the vectors waited behind everything that closes nothing
    before = keep_options_open(ranked, lambda item: item[:-1], closed, pull=False)
    assert before == ["restrict1", "bounds1", "unroll1", "staging1", "vec1", "vec2"]
    # down a chain: the vectors would close the unrolling, which would close the staging
    chain = {"vec": {"unroll"}, "unroll": {"staging"}}
    ordered = keep_options_open(ranked, lambda item: item[:-1], chain)
    assert ordered == ["staging1", "unroll1", "vec1", "restrict1", "bounds1", "vec2"]


def test_vector_widths_keep_their_bytes() -> None:
    bf16 = load_problem(ROOT / "heldout" / "layernorm")
    f32 = load_problem(ROOT / "heldout" / "l2_normalize")
    assert transfer_carrier(Carrier(vector_width=4), ["float32"], bf16).vector_width == 8
    assert transfer_carrier(Carrier(vector_width=8), ["bfloat16"], f32).vector_width == 4
    assert transfer_carrier(Carrier(vector_width=4), ["float32"], f32).vector_width == 4
    # 2 bytes cannot be split into 4-byte elements: kept as learned
    assert transfer_carrier(Carrier(vector_width=1), ["bfloat16"], f32).vector_width == 1
    assert transfer_carrier(Carrier(block_size=512), ["float32"], bf16) == Carrier(block_size=512)


def test_expression_choices_naming_what_the_target_lacks_are_left_out() -> None:
    from klineage.replay.ordering import without_foreign_names

    learned = Carrier.model_validate(
        {"block_size": 256, "bound": "kThreads", "min_blocks_expr": "kD == 128 ? 2 : 4"}
    )
    target = "template <int kThreads> __global__ void k(float* y) { y[0] = kThreads; }"
    kept = without_foreign_names(learned, target)
    assert kept.as_dict() == {"block_size": 256, "bound": "kThreads"}
    assert without_foreign_names(learned, target + " constexpr int kD = 64;") == learned


def test_a_cycle_is_not_overtaken_by_unrelated_skills() -> None:
    # log_softmax: block_per_row and online_softmax close each other; one is lost either way,
    # so the best-ranked goes at its rank instead of after every unrelated skill
    ranked = ["bpr1", "fast1", "os1", "bpr2", "prag1"]
    closed = {"bpr": {"os"}, "os": {"bpr"}, "prag": {"os"}}
    ordered = keep_options_open(ranked, lambda item: item[:-1], closed)
    assert ordered == ["bpr1", "fast1", "os1", "bpr2", "prag1"]
    # before: every unrelated skill first, the best-ranked skill fourth
    assert ordered.index("bpr1") < ordered.index("fast1")


def test_a_staged_gemm_races_the_experts_micro_tile_beside_the_default(tmp_path) -> None:
    """The skills method's carriers for a coarsening skill on a staged tile product end with
    the rule's alternative (8 x 8 outputs a thread), after the learned ones and the default;
    on a kernel without such a product there is none."""
    from klineage.gate.log import GateLog
    from klineage.kernel import KernelSource
    from klineage.mechanisms import Carrier
    from klineage.problem import load_problem
    from klineage.replay.methods import Materializer, SkillsMethod
    from klineage.skills import SkillLibrary
    from tests.conftest import FIXTURES, REPO

    skills = list(SkillLibrary.load(REPO / "skills_out"))
    coarsening = next(s for s in skills if s.mechanism == "thread_coarsening")
    method = SkillsMethod(
        Materializer(GateLog(tmp_path / "log.jsonl", None), skills),
        load_problem(REPO / "heldout" / "sgemm"),
    )
    staged = KernelSource.from_file(
        FIXTURES / "mechanisms" / "thread_coarsening" / "forward" / "sgemm_tiles.naive.cu"
    )
    carriers = method.carriers(coarsening, staged)
    assert carriers[-1] == Carrier(tm=8, tn=8)
    assert Carrier() in carriers[:-1]
    naive = KernelSource.from_file(REPO / "heldout" / "sgemm" / "kernel.cu")
    assert Carrier(tm=8, tn=8) not in method.carriers(coarsening, naive)


def test_what_changed_nothing_or_measured_slower_on_the_way_goes_after_the_rest(
    tmp_path: Path,
) -> None:
    # layernorm's naive kernel as if reached from a parent state where block_per_row's runs
    # were within noise (idle), fast_math's slower (failed) and vectorized_access kept
    problem = load_problem(ROOT / "heldout" / "layernorm")
    naive = KernelSource.from_file(problem.kernel_path)
    library = list(SkillLibrary.load(ROOT / "skills_out"))
    materializer = Materializer(GateLog(tmp_path / "log.jsonl", None), library)  # type: ignore[arg-type]
    search = materializer.method("skills", problem)
    fresh = [m.name for m in search.candidates(naive)]
    assert fresh[0] == "block_per_row" and "fast_math" in fresh
    search._came_from[naive.fingerprint] = ("parent", [])
    search._outcomes["parent"] = {
        "block_per_row": False,
        "fast_math": True,
        "vectorized_access": False,
    }
    search._kept_at["parent"] = {"vectorized_access"}
    assert search.idle_before(naive) == {"block_per_row"}
    assert search.failed_before(naive) == {"fast_math"}
    names = [m.name for m in search.candidates(naive)]
    rest = [n for n in names if n not in ("block_per_row", "fast_math")]
    assert names == rest + ["block_per_row"] * fresh.count("block_per_row") + [
        "fast_math"
    ] * fresh.count("fast_math")
    # a kept mechanism keeps its rank: vectorized_access is not moved
    assert rest == [n for n in fresh if n not in ("block_per_row", "fast_math")]
