"""The launch_bounds mechanism: fixtures both ways, inference of the bound, refusals."""

from __future__ import annotations

import pytest

from klineage.conditions import BlockSizeAtMost
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from tests.conftest import FIXTURES, REPO
from tests.mechanisms.roundtrip import RoundTripSuite

mechanism = get("launch_bounds")


class TestLaunchBounds(RoundTripSuite):
    mechanism = "launch_bounds"


def _kernel(launch: str, extra: str = "") -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        "__global__ void k(float* y, int64_t n) { y[threadIdx.x] = 0.0f; }\n"
        f'extern "C" int run(float* y, int64_t rows, int64_t cols, cudaStream_t s) {{\n{extra}'
        f"  {launch}\n  return (int)cudaGetLastError();\n}}\n"
    )


@pytest.mark.parametrize(
    ("launch", "extra", "bound"),
    [
        ("k<<<rows, 128>>>(y, cols);", "", "__launch_bounds__(128)"),
        ("k<<<rows, block, 0, s>>>(y, cols);", "  dim3 block(32, 8);\n", "__launch_bounds__(256)"),
        ("k<<<rows, threads>>>(y, cols);", "  const int threads = 64 * 2;\n", "(128)"),
    ],
)
def test_the_bound_is_inferred_from_the_launches(launch: str, extra: str, bound: str) -> None:
    source = _kernel(launch, extra)
    (candidate,) = mechanism.candidates(source)
    assert bound in mechanism.apply(source, candidate).text


def test_a_runtime_block_size_is_refused_unless_the_carrier_gives_one() -> None:
    source = _kernel("k<<<rows, (unsigned)cols>>>(y, cols);")
    (candidate,) = mechanism.candidates(source)
    with pytest.raises(MechanismRefused) as refused:
        mechanism.apply(source, candidate)
    assert "not a compile-time constant" in refused.value.reason
    assert "--carrier block_size=N" in refused.value.reason
    applied = mechanism.apply(source, candidate, Carrier(block_size=512, min_blocks=2))
    assert "__global__ void __launch_bounds__(512, 2) k(" in applied.text
    with pytest.raises(MechanismRefused, match=r"not in 1\.\.1024"):
        mechanism.apply(source, candidate, Carrier(block_size=2048))
    with pytest.raises(MechanismRefused, match="min_blocks='two' must be an integer"):
        mechanism.apply(source, candidate, Carrier.from_pairs(["block_size=64", "min_blocks=two"]))


def test_disagreeing_launches_and_no_launch_are_refused() -> None:
    both = _kernel("k<<<rows, 128>>>(y, cols); k<<<rows, 256>>>(y, cols);")
    with pytest.raises(MechanismRefused, match="different block sizes"):
        mechanism.apply(both, mechanism.candidates(both)[0])
    alone = KernelSource("__global__ void k(float* y) {}\n")
    with pytest.raises(MechanismRefused, match="no launch of k"):
        mechanism.apply(alone, mechanism.candidates(alone)[0])


def test_condition_bounds_the_launch_block_size() -> None:
    source = _kernel("k<<<rows, 128>>>(y, cols);")
    applied = mechanism.apply(source, mechanism.candidates(source)[0])
    (condition,) = mechanism.conditions(applied, mechanism.detect(applied)[0])
    assert isinstance(condition, BlockSizeAtMost)
    assert (condition.n, condition.block_size) == (128, "128")
    assert "at most 128" in condition.prose


def test_unknown_carrier_keys_are_refused() -> None:
    source = _kernel("k<<<rows, 128>>>(y, cols);")
    with pytest.raises(MechanismRefused, match="accepts: block_size, bound, min_blocks"):
        mechanism.apply(source, mechanism.candidates(source)[0], Carrier(unroll=4))


def test_a_template_dependent_block_count_is_carried_and_restored() -> None:
    from klineage.mining.removal import reapply, remove_mechanism

    expert = KernelSource.from_file(REPO / "expert_kernels" / "fmha_fp16" / "kernel.cu")
    (site,) = mechanism.detect(expert)
    assert mechanism.carrier_of(expert, site).as_dict() == {
        "block_size": 128,  # kThreads folds to 128
        "min_blocks_expr": "kD == 128 ? 2 : 4",
    }
    removal = remove_mechanism(expert, mechanism)
    assert reapply(removal).text == expert.text  # re-applying once dropped the block count
    (candidate,) = mechanism.candidates(removal.simplified)
    both = Carrier(block_size=128, min_blocks=2, min_blocks_expr="kD == 128 ? 2 : 4")
    with pytest.raises(MechanismRefused, match="not both"):
        mechanism.apply(removal.simplified, candidate, both)


def test_a_bound_below_the_launched_block_is_refused_before_the_gate() -> None:
    """The H200 replay gated batched_hgemm with a 128 bound on a 256-thread launch: it failed
    to launch (cudaErrorInvalidValue). That is now known without a gate run."""
    source = _kernel("k<<<rows, 256>>>(y, cols);")
    (candidate,) = mechanism.candidates(source)
    with pytest.raises(MechanismRefused, match="below the 256 threads k is launched with"):
        mechanism.apply(source, candidate, Carrier(block_size=128))
    assert (
        "__launch_bounds__(512)" in mechanism.apply(source, candidate, Carrier(block_size=512)).text
    )


def test_a_bound_is_inferred_per_kernel_where_namespaces_share_its_name() -> None:
    kernel = KernelSource.from_file(FIXTURES / "cuda" / "namespaced_variants.cu")
    narrow, wide = mechanism.candidates(kernel)
    assert mechanism.default_carrier(kernel, narrow).block_size == 256
    assert mechanism.default_carrier(kernel, wide).block_size == 512
    with pytest.raises(MechanismRefused, match="below the 512 threads"):
        mechanism.apply(kernel, wide, Carrier(block_size=256))
