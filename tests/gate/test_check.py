"""The element rule, on CPU tensors."""

from __future__ import annotations

import torch

from klineage.gate.check import changed_count, changed_elements, compare_output, output_fails
from klineage.problem import Tolerance

TOL = Tolerance(atol=1e-4, rtol=1e-4)


def test_identical_outputs_pass() -> None:
    ref = torch.randn(64, 32)
    result = compare_output("y", ref.clone(), ref, TOL)
    assert result.ok and result.max_abs == 0 and result.total == 64 * 32


def test_element_fails_only_beyond_both_tolerances() -> None:
    ref = torch.tensor([1000.0, 1.0, 0.0])
    # 0.05 > atol but < rtol*1000: passes; 0.05 on 1.0 fails both; 5e-5 on 0 is within atol
    out = torch.tensor([1000.05, 1.05, 5e-5])
    result = compare_output("y", out, ref, Tolerance(atol=1e-2, rtol=1e-4))
    assert result.bad == 1 and result.first_bad == (1,)
    assert abs(result.first_bad_value - 1.05) < 1e-6
    assert "1 of 3 elements wrong" in result.describe()


def test_nan_poison_left_behind_is_reported_as_unwritten() -> None:
    ref = torch.ones(10)
    out = ref.clone()
    out[5:] = float("nan")
    result = compare_output("y", out, ref, TOL)
    assert result.bad == 5 and result.unwritten == 5
    assert "5 never written" in result.describe()


def test_non_finite_output_passes_only_where_the_reference_has_it() -> None:
    ref = torch.tensor([float("inf"), float("nan"), 1.0])
    assert compare_output("y", ref.clone(), ref, TOL).ok
    out = torch.tensor([float("inf"), float("nan"), float("inf")])
    assert compare_output("y", out, ref, TOL).bad == 1
    out = torch.tensor([-float("inf"), float("nan"), 1.0])
    assert compare_output("y", out, ref, TOL).bad == 1


def test_half_precision_is_compared_in_float32() -> None:
    ref = torch.randn(1000).to(torch.bfloat16)
    out = (ref.float() * 1.001).to(torch.bfloat16)
    assert compare_output("y", out, ref, Tolerance(atol=1e-2, rtol=1e-2)).ok
    assert not compare_output("y", out + 1, ref, Tolerance(atol=1e-2, rtol=1e-2)).ok


def test_integers_are_exact_and_poison_counts() -> None:
    ref = torch.arange(8, dtype=torch.int64)
    out = ref.clone()
    out[3] = torch.iinfo(torch.int64).min
    result = compare_output("idx", out, ref, Tolerance(atol=0, rtol=0))
    assert result.bad == 1 and result.unwritten == 1
    assert compare_output("idx", ref.clone(), ref, Tolerance(atol=0, rtol=0)).ok


def test_changed_elements_is_bitwise_and_nan_aware() -> None:
    before = torch.tensor([1.0, float("nan"), 3.0])
    assert changed_elements(before, before.clone()) == 0
    after = before.clone()
    after[2] = 0.0
    assert changed_elements(before, after) == 1


def test_max_errors_skip_non_finite_and_zero_references() -> None:
    ref = torch.tensor([0.0, 2.0, float("inf"), 4.0])
    out = torch.tensor([0.5, 2.5, float("inf"), 4.0])
    result = compare_output("y", out, ref, TOL)
    # |err| 0.5 twice; inf - inf is NaN and skipped; rel only where ref != 0: 0.5 / 2
    assert result.max_abs == 0.5 and result.max_rel == 0.25 and result.bad == 2
    empty = compare_output("y", torch.empty(0), torch.empty(0), TOL)
    assert empty.ok and empty.max_abs == 0.0 and empty.total == 0


def test_device_flags_agree_with_the_counting_checks() -> None:
    ref = torch.randn(256)
    assert not bool(output_fails(ref.clone(), ref, TOL))
    wrong = ref.clone()
    wrong[17] += 1.0
    assert bool(output_fails(wrong, ref, TOL)) == (not compare_output("y", wrong, ref, TOL).ok)
    poisoned = torch.full_like(ref, float("nan"))
    assert bool(output_fails(poisoned, ref, TOL))
    before = torch.tensor([1.0, float("nan")])
    assert int(changed_count(before, before.clone())) == 0
    assert int(changed_count(before, torch.tensor([1.0, 0.0]))) == 1
    assert changed_count(before, before.clone()).dim() == 0  # read with others at once


def test_indices_are_checked_by_what_they_select() -> None:
    from klineage.gate.check import compare_indices

    source = torch.tensor([[5.0, 1.0, 5.0, 3.0]])
    values = torch.tensor([[5.0, 5.0]])
    # a tie: either order of the two 5.0s is right
    assert compare_indices("i", torch.tensor([[2, 0]]), source, values).ok
    assert compare_indices("i", torch.tensor([[0, 2]]), source, values).ok
    repeated = compare_indices("i", torch.tensor([[0, 0]]), source, values)
    assert repeated.bad == 1
    wrong = compare_indices("i", torch.tensor([[0, 3]]), source, values)
    assert wrong.bad == 1 and wrong.first_bad == (0, 1)
    out_of_range = compare_indices("i", torch.tensor([[0, 4]]), source, values)
    assert out_of_range.bad == 1


def test_sorted_comparison_ignores_order(tmp_path) -> None:
    import json

    from klineage.gate.check import compare_by_spec
    from klineage.problem import load_definition
    from tests.conftest import FIXTURES

    data = json.loads((FIXTURES / "problems" / "scale_rows" / "definition.json").read_text())
    data["outputs"]["y"]["compare"] = "sorted"
    (tmp_path / "definition.json").write_text(json.dumps(data))
    definition = load_definition(tmp_path)
    ref = {"y": torch.tensor([[1.0, 2.0, 3.0]])}
    assert compare_by_spec(definition, "y", {"y": torch.tensor([[3.0, 1.0, 2.0]])}, ref, {}).ok
    assert not compare_by_spec(definition, "y", {"y": torch.tensor([[3.0, 1.0, 1.0]])}, ref, {}).ok
