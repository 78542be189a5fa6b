"""The warp_shuffle_scan mechanism: fixtures both ways, the Hillis-Steele step's lane
arithmetic, refusals, and the top-k expert's block-wide scan."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get, remove_all
from tests.mechanisms.reductions_experts import (
    assert_detected_where_listed,
    check_expert_removals_compile,
)
from tests.mechanisms.roundtrip import RoundTripSuite

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
