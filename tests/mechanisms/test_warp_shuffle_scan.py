"""The warp_shuffle_scan mechanism: fixtures both ways, the Hillis-Steele step's lane
arithmetic, refusals, and the top-k expert's block-wide scan."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get, remove_all
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, assert_close, floats, run_on_host
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import RoundTripSuite, compile_ok

mechanism = get("warp_shuffle_scan")


class TestWarpShuffleScan(RoundTripSuite):
    mechanism = "warp_shuffle_scan"


def _device(body: str) -> KernelSource:
    return KernelSource(
        "#include <cuda_runtime.h>\n#include <stdint.h>\n"
        f"__device__ uint32_t scan(uint32_t v, int lane) {{\n{body}\n  return v;\n}}\n"
        "__global__ void use(uint32_t* y) {\n"
        "  y[threadIdx.x] = scan(y[threadIdx.x], threadIdx.x & 31);\n}\n"
    )


def test_lanes_below_the_offset_keep_their_own_value() -> None:
    source = _device(
        "  for (int o = 1; o < 32; o <<= 1) {\n"
        "    const uint32_t other = __shfl_up_sync(0xffffffffu, v, o);\n"
        "    if (lane >= o) v += other;\n  }"
    )
    removed = remove_all(source, mechanism)
    assert (
        "const uint32_t other = xchg[xchg_warp][xchg_lane >= o ? xchg_lane - o : xchg_lane];"
        in removed.text
    )
    assert "__shared__ uint32_t xchg[32][32];" in removed.text
    assert "if (lane >= o) v += other;" in removed.text


def test_two_scans_of_one_function_share_the_exchange_rows() -> None:
    loop = (
        "  for (int o = 1; o < 32; o <<= 1) {\n"
        "    const uint32_t other = __shfl_up_sync(0xffffffffu, v, o);\n"
        "    if (lane >= o) v += other;\n  }"
    )
    removed = remove_all(_device(f"{loop}\n{loop}"), mechanism)
    assert removed.text.count("__shared__") == 1
    assert removed.text.count("__syncwarp();") == 4


def test_a_scan_past_the_warp_is_refused() -> None:
    source = _device("  for (int o = 1; o < 64; o <<= 1) v += __shfl_up_sync(~0u, v, o);")
    (site,) = mechanism.detect(source)
    assert "offset 32, outside 0..31" in (site.refusal or "")
    with pytest.raises(MechanismRefused, match="outside"):
        mechanism.remove(source, site)


def test_the_expert_is_detected_where_listed() -> None:
    assert_detected_where_listed("warp_shuffle_scan")


@pytest.mark.nvcc
def test_every_expert_removal_compiles(mechanism_builder: Builder) -> None:
    refusals = check_expert_removals_compile("warp_shuffle_scan", mechanism_builder)
    assert refusals == []


# ---------------------------------------------------------------------------------------------
# Forward on a naive row scan (form=rows): a warp per row, 32 elements a turn
# ---------------------------------------------------------------------------------------------

ROW_SCAN = """#include <cuda_runtime.h>
#include <stdint.h>

__global__ void running_max_sum(const float* x, float* y, int64_t rows, int64_t cols) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float total = 0.0f;
  for (int c = 0; c < cols; ++c) {
    total += 2.0f * x[r * cols + c];
    y[r * cols + c] = total;
  }
}

extern "C" int run(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  running_max_sum<<<(unsigned)((rows + 127) / 128), 128, 0, stream>>>(x, y, rows, cols);
  return 0;
}
"""


def _scan_cases(kernel: str, warp_per_row: bool) -> list[Case]:
    cases = []
    for rows, cols in ((1, 1), (3, 31), (5, 70), (9, 33)):
        buffers = [Buffer("x", "float", "rows * cols"), Buffer("y", "float", "rows * cols", True)]
        call = f"{kernel}(x, y, rows, cols)"
        grid = "dim3((unsigned)((rows + 7) / 8))" if warp_per_row else ""
        cases.append(
            Case({"rows": rows, "cols": cols}, buffers, call, "rows", grid=grid,
                 block_dims="dim3(256)")
        )  # fmt: skip
    return cases


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        (ROW_SCAN, "running_max_sum"),
        ((REPO / "heldout" / "cumsum_rows" / "kernel.cu").read_text(), "cumsum_rows"),
    ],
    ids=["fixture", "cumsum_rows"],
)
def test_a_naive_row_scan_becomes_a_warp_scan_with_the_same_sums(text: str, kernel: str) -> None:
    """The warp's chunked scan gives the serial loop's sums (in another order: within float
    rounding), with the row check, the lane and the launch's warps per block written."""
    naive = KernelSource(text, name=f"{kernel}.cu")
    [site] = [s for s in mechanism.candidates(naive) if s.detail.get("form") == "rows"]
    applied = mechanism.apply(naive, site, mechanism.default_carrier(naive, site))
    assert "__shfl_up_sync(0xffffffffu" in applied.text and ") >> 5;" in applied.text
    assert "/ 8), 256, 0, stream>>>" in applied.text  # 8 warps, 8 rows a block
    want = floats(run_on_host(naive.text, _scan_cases(kernel, warp_per_row=False)))
    got = floats(run_on_host(applied.text, _scan_cases(kernel, warp_per_row=True)))
    assert_close(got, want)
    compile_ok(Builder(device_only=True), [applied])


def test_a_row_scan_in_another_form_is_no_candidate() -> None:
    """A loop that reads the running sum (or stores something else) is no row scan."""
    for body in (
        "total += x[r * cols + c];\n    y[r * cols + c] = total * 0.5f;",
        "total += x[r * cols + c] + total;\n    y[r * cols + c] = total;",
    ):
        text = ROW_SCAN.replace(
            "total += 2.0f * x[r * cols + c];\n    y[r * cols + c] = total;", body
        )
        assert text != ROW_SCAN
        sites = mechanism.candidates(KernelSource(text))
        assert not [s for s in sites if s.detail.get("form") == "rows"], body
