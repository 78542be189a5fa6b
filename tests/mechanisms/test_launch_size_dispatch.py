"""The launch_size_dispatch mechanism: a size dispatch reduced to its general path."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.mechanisms.roundtrip import RoundTripSuite, fixture_pairs, removal_chain
from tests.mechanisms.tiles_support import check_expert_detection, check_expert_removals_compile

mechanism = get("launch_size_dispatch")


class TestLaunchSizeDispatch(RoundTripSuite):
    """Forward here is the round trip: the removed chain, carried, goes back where it was
    (its kernels are still in the file)."""

    mechanism = "launch_size_dispatch"


def test_a_new_dispatch_is_refused_with_the_reason() -> None:
    """Without a carried chain, or with one whose kernels the target lacks, apply is refused:
    a dispatch needs specialized kernels, which a rule does not write."""
    for pair in fixture_pairs("launch_size_dispatch"):
        chain = removal_chain(mechanism, pair.before)
        for candidate in mechanism.candidates(chain.states[-1]):
            with pytest.raises(MechanismRefused, match="specialized kernels"):
                mechanism.apply(chain.states[-1], candidate)
    pair = fixture_pairs("launch_size_dispatch")[0]
    (site,) = [s for s in mechanism.detect(pair.before) if s.supported]
    carried = mechanism.carrier_of(pair.before, site)
    foreign = Carrier.model_validate(
        {**carried.as_dict(), "dispatch": "if (n < 64) tiny_kernel<<<1, 64>>>(y, n);\nelse " + "x;"}
    )
    (candidate, *_) = mechanism.candidates(pair.after)
    with pytest.raises(MechanismRefused, match=r"not all here \(tiny_kernel missing\)"):
        mechanism.apply(pair.after, candidate, foreign)


def test_the_experts_dispatches_go_back_exactly() -> None:
    """softmax and RMSNorm (a final else) and gemm (returning branches before the tiled path,
    with the comment above that path kept in place): removed, then re-applied byte for byte."""
    from klineage.mining.removal import reapply, remove_mechanism
    from tests.conftest import REPO

    for folder in ("softmax", "fused_add_rmsnorm", "gemm_bf16"):
        expert = KernelSource.from_file(REPO / "expert_kernels" / folder / "kernel.cu")
        removal = remove_mechanism(expert, mechanism)
        assert removal.changed, folder
        assert reapply(removal).text == expert.text, folder


def test_experts_listing_it_are_detected() -> None:
    assert check_expert_detection("launch_size_dispatch") >= 3


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    check_expert_removals_compile(mechanism_builder, "launch_size_dispatch")


def test_the_experts_keep_their_general_kernel() -> None:
    from tests.conftest import REPO

    for folder, kept in (
        ("softmax", "softmax_online_rows<512, false><<<"),
        ("fused_add_rmsnorm", "add_rmsnorm_rows_scalar<512><<<"),
    ):
        kernel = KernelSource.from_file(REPO / "expert_kernels" / folder / "kernel.cu")
        (site,) = mechanism.detect(kernel)
        run = mechanism.remove(kernel, site).text.split('extern "C" int run')[1]
        assert kept in run and run.count("<<<") == 1
        assert "aligned" not in run and "packed" not in run  # the unused flag goes too


def test_a_chain_without_fallback_is_refused() -> None:
    source = KernelSource(
        "__global__ void a(float* y) {}\n__global__ void b(float* y) {}\n"
        'extern "C" int run(float* y, long n, void* s) {\n'
        "  if (n <= 128) a<<<1, 32>>>(y);\n  else if (n <= 4096) b<<<1, 32>>>(y);\n"
        "  return 0;\n}\n"
    )
    (site,) = mechanism.detect(source)
    assert "no final else" in (site.refusal or "")


def test_guards_are_not_dispatches() -> None:
    source = KernelSource(
        "__global__ void a(float* y) {}\n"
        'extern "C" int run(float* y, long n, void* s) {\n  if (n > 0) a<<<1, 32>>>(y);\n'
        "  return 0;\n}\n"
    )
    assert mechanism.detect(source) == []


def test_the_continuation_lines_of_the_fallback_move_with_it() -> None:
    after = fixture_pairs("launch_size_dispatch")[0].after.text
    assert "\n  scale_block_rows<1024><<<(unsigned)rows, 1024, 0, stream>>>(x, y, cols);\n" in after


def test_a_choice_on_divisibility_and_alignment_is_a_dispatch_that_goes_back() -> None:
    """``if (packed)`` with ``packed = K % 4 == 0 && is_aligned(x) && ...``: the scalar else
    stands for every shape; the chain and its bool local go back byte for byte, and a braced
    else (linear_relu's, with its own grid) is put back where the removal left it."""
    from klineage.mining.removal import reapply, remove_mechanism
    from tests.conftest import REPO
    from tests.mechanisms.roundtrip import PUBLIC_FORMS

    (pair,) = fixture_pairs("launch_size_dispatch", PUBLIC_FORMS)
    removal = remove_mechanism(pair.before, mechanism)
    assert removal.simplified.text == pair.after.text
    assert reapply(removal).text == pair.before.text
    expert = KernelSource.from_file(REPO / "expert_kernels" / "linear_relu" / "kernel.cu")
    removal = remove_mechanism(expert, mechanism)
    assert "linear_relu_tiled<<<" not in removal.simplified.text.split('extern "C"')[1]
    back = reapply(removal).text
    assert " ".join(back.split()) == " ".join(expert.text.split())


def test_a_remainder_guard_alone_is_not_a_dispatch() -> None:
    source = KernelSource(
        "__global__ void a(float* y) {}\n"
        'extern "C" int run(float* y, long n, void* s) {\n  if (n % 4 == 0) a<<<1, 32>>>(y);\n'
        "  return 0;\n}\n"
    )
    assert mechanism.detect(source) == []
