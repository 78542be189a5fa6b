"""The candidate_filtering mechanism: fixtures both ways, the top-k expert, other forms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from klineage.conditions import Prose
from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get, remove_all
from klineage.mechanisms.recall import detection_recall
from tests.conftest import REPO
from tests.mechanisms.roundtrip import FIXTURES, RoundTripSuite, compile_ok

NAME = "candidate_filtering"
mechanism = get(NAME)
TOPK = KernelSource.from_file(REPO / "expert_kernels" / "topk" / "kernel.cu")
BEFORE = KernelSource.from_file(FIXTURES / NAME / "before.cu")
AFTER = KernelSource.from_file(FIXTURES / NAME / "after.cu")

EARLY_RETURN = """  if (count > (unsigned)kCapacity) {
    sum_from_row(sh, row, n, t);
    return;
  }
  // stage the survivors, then sum them from shared memory
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    if (row[i] > t) sh.kept[atomicAdd(&sh.staged, 1u)] = row[i];
  __syncthreads();
  sum_from_kept(sh);
"""
FAST_FIRST = """  if (count <= (unsigned)kCapacity) {
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
      if (row[i] > t) sh.kept[atomicAdd(&sh.staged, 1u)] = row[i];
    __syncthreads();
    sum_from_kept(sh);
    return;
  }
  sum_from_row(sh, row, n, t);
"""
IF_ELSE = """  if (count <= (unsigned)kCapacity) {
    for (int64_t i = threadIdx.x; i < n; i += kThreads)
      if (row[i] > t) sh.kept[atomicAdd(&sh.staged, 1u)] = row[i];
    __syncthreads();
    sum_from_kept(sh);
  } else {
    sum_from_row(sh, row, n, t);
  }
"""


def experts_listing(name: str) -> list[Path]:
    """The expert kernel folders whose mechanisms.json lists ``name``."""
    return [
        listed.parent
        for listed in sorted((REPO / "expert_kernels").glob("*/mechanisms.json"))
        if any(e["mechanism"] == name for e in json.loads(listed.read_text()))
    ]


def _variant(paths: str) -> KernelSource:
    assert EARLY_RETURN in BEFORE.text
    return KernelSource(BEFORE.text.replace(EARLY_RETURN, paths), name="variant.cu")


class TestCandidateFiltering(RoundTripSuite):
    mechanism = NAME


@pytest.mark.parametrize("paths", [FAST_FIRST, IF_ELSE], ids=["fast-first", "if-else"])
def test_other_forms_keep_only_the_general_path(paths: str) -> None:
    source = _variant(paths)
    (site,) = mechanism.detect(source)
    assert site.supported and site.detail["staged"] == "sh.kept"
    assert mechanism.remove(source, site).text == AFTER.text


def test_an_else_if_guard_keeps_its_braces() -> None:
    source = _variant("  if (n == 0) {\n    return;\n  } else " + IF_ELSE.lstrip())
    (site,) = mechanism.detect(source)
    plain = mechanism.remove(source, site).text
    assert "  } else {\n    sum_from_row(sh, row, n, t);\n  }\n}" in plain


def test_a_guard_with_side_effects_is_refused() -> None:
    guard = "atomicAdd(&sh.count, 0u) <= (unsigned)kCapacity"
    source = _variant(IF_ELSE.replace("count <= (unsigned)kCapacity", guard))
    (site,) = mechanism.detect(source)
    assert site.refusal == "the guard has side effects, which removing it would drop"
    assert remove_all(source, mechanism) is source


def test_apply_without_the_fast_path_is_refused_with_a_reason() -> None:
    (candidate,) = mechanism.candidates(AFTER)
    assert candidate.snippet == "sum_from_row(sh, row, n, t);"
    with pytest.raises(MechanismRefused, match="a rule cannot write a staging pass"):
        mechanism.apply(AFTER, candidate)
    with pytest.raises(MechanismRefused, match="only the early-return form"):
        mechanism.apply(AFTER, candidate, Carrier(form="else", guard="x", fast_path="y"))


def test_a_guard_without_shared_staging_is_not_a_filter() -> None:
    # the same guard around paths that stage nothing in a capacity-sized shared array
    staging = "sh.kept[atomicAdd(&sh.staged, 1u)] = row[i]"
    source = KernelSource(BEFORE.text.replace(staging, "atomicAdd(&sh.total, row[i])"))
    assert mechanism.detect(source) == []


def test_topk_keeps_the_select_from_row_path_and_comes_back_exactly() -> None:
    (site,) = mechanism.detect(TOPK)
    assert site.supported and site.detail == {
        "form": "return",
        "capacity": "3072",
        "staged": "sh.cand_key",
    }
    plain = mechanism.remove(TOPK, site)
    tail = plain.text[plain.text.index("__global__ void __launch_bounds__") - 200 :]
    assert "  select_from_row<kVec4>(sh, row, n, top, k, out);\n}\n" in tail
    assert "select_from_candidates(sh, top, k, out);" not in tail
    (candidate,) = mechanism.candidates(plain)
    again = mechanism.apply(plain, candidate, mechanism.carrier_of(TOPK, site))
    assert again.text == TOPK.text


def test_topk_is_detected_where_its_mechanisms_json_says() -> None:
    folders = experts_listing(NAME)
    assert folders, "no expert kernel lists candidate_filtering"
    for folder in folders:
        listed = json.loads((folder / "mechanisms.json").read_text())
        report = detection_recall(
            KernelSource.from_file(folder / "kernel.cu"),
            [e for e in listed if e["mechanism"] == NAME],
        )
        assert report.recall == 1.0, str(report)


def test_conditions_say_the_general_path_must_handle_everything() -> None:
    (site,) = mechanism.detect(TOPK)
    texts = [c.prose for c in mechanism.conditions(TOPK, site)]
    assert all(isinstance(c, Prose) for c in mechanism.conditions(TOPK, site))
    assert any("general path must give the same result for every input" in t for t in texts)
    assert any("sh.cand_key (3072 elements)" in t for t in texts)


@pytest.mark.nvcc
def test_expert_removals_and_other_forms_compile(mechanism_builder: Builder) -> None:
    sources: list[KernelSource] = []
    for folder in experts_listing(NAME):
        kernel = KernelSource.from_file(folder / "kernel.cu")
        for site in mechanism.detect(kernel):
            assert site.supported, f"{folder.name}: {site} refused: {site.refusal}"
            sources.append(mechanism.remove(kernel, site))
    sources.append(remove_all(remove_all(TOPK, mechanism), get("warp_ballot_compaction")))
    sources += [_variant(FAST_FIRST), _variant(IF_ELSE)]
    compile_ok(mechanism_builder, sources)
