"""Index forms: polynomial arithmetic, coefficients, substitution, opaque dependencies."""

from __future__ import annotations

from klineage.cuda.analysis.forms import IndexForm

tx = IndexForm.atom("threadIdx.x")
bx = IndexForm.atom("blockIdx.x")
bdy = IndexForm.atom("blockDim.y")


def test_arithmetic_collects_like_terms() -> None:
    form = bx * bdy + tx + 3 - tx * 1
    assert str(form) == "3 + blockDim.y·blockIdx.x"
    assert form.coefficient("blockIdx.x") == bdy
    assert form.coefficient("threadIdx.x") == IndexForm()
    assert (form - 3).constant_term == 0 and not form.is_constant
    assert IndexForm.constant(12).exact_division(4) == IndexForm.constant(3)
    assert (tx * 4 + 2).exact_division(4) is None


def test_substitution_replaces_parameters_and_keeps_opaque_dependencies() -> None:
    row = IndexForm.atom("row")
    lane_chunk = IndexForm.opaque_atom("[row % 8]", {"row"})
    form = row * 64 + lane_chunk
    bound = form.substitute({"row": bx * bdy + IndexForm.atom("threadIdx.y")})
    assert bound.coefficient("blockIdx.x") == bdy * 64
    assert bound.base_atoms() == {"blockIdx.x", "blockDim.y", "threadIdx.y"}
    assert bound.is_opaque("[row % 8]") and bound.depends_on("threadIdx.y")


def test_only_and_without_split_the_terms() -> None:
    form = bx * 128 + tx * 4 + IndexForm.atom("k@3")
    assert form.only({"threadIdx.x"}) == tx * 4
    assert form.without({"threadIdx.x", "k@3"}) == bx * 128
    assert form.atoms() == {"blockIdx.x", "threadIdx.x", "k@3"}
