"""Nsight Compute reports recorded on the H200 (tests/fixtures/ncu/), read on the CPU: the raw
page parsed into launch counters, checked against ncu's own details page of the same report,
and classified."""

from __future__ import annotations

import pytest

from klineage.gate import ncu
from klineage.gate.bottleneck import Bottleneck, classify, peaks_for
from klineage.gate.profile import Profile
from tests.recorded_profiles import REPORTS, details, gelu_launch, gemm_launch, recorded, sol_rule


def test_the_raw_page_reads_as_one_launch_in_base_units() -> None:
    (launch,) = ncu.parse_raw_csv(recorded("gelu_naive.raw.csv"))
    assert launch.kernel == "gelu_tanh(const float *, float *, long)"
    # printed as 2.40 us and 47.104 Kbyte: read as nanoseconds and bytes
    assert launch.get(ncu.DURATION) == pytest.approx(2400.0)
    assert launch.units[ncu.DURATION] == "nsecond"
    assert launch.get("dram__bytes_read.sum") == pytest.approx(47104.0)
    assert launch.get("dram__sectors_read.sum") * 32 == launch.get("dram__bytes_read.sum")
    assert launch.get("launch__stack_size") == 1024  # a thousands separator: "1,024"
    every = [m for m in ncu.PROFILE_METRICS if launch.get(m) is None]
    # `--set full` carries every metric the stage asks for but the FP instruction counts
    assert every == [*ncu.FP32_OPS, *ncu.FP16_OPS]


def test_the_counters_agree_with_ncus_own_details_page() -> None:
    launch, page = gelu_launch(), details("gelu_naive")
    sol = "GPU Speed Of Light Throughput"
    assert launch.duration_ns / 1e3 == pytest.approx(float(page[(sol, "Duration")]), abs=0.01)
    for field, metric in [
        ("dram_pct", "DRAM Throughput"),
        ("memory_pct", "Memory Throughput"),
        ("l1_pct", "L1/TEX Cache Throughput"),
        ("l2_pct", "L2 Cache Throughput"),
        ("sm_pct", "Compute (SM) Throughput"),
    ]:
        assert getattr(launch, field) == pytest.approx(float(page[(sol, metric)]), abs=0.01)
    occupancy = "Occupancy"
    assert launch.achieved_occupancy_pct == pytest.approx(
        float(page[(occupancy, "Achieved Occupancy")]), abs=0.01
    )
    assert launch.theoretical_occupancy_pct == float(page[(occupancy, "Theoretical Occupancy")])
    assert launch.blocks_per_sm_limits == {
        "registers": float(page[(occupancy, "Block Limit Registers")]),
        "shared memory": float(page[(occupancy, "Block Limit Shared Mem")]),
        "block size": float(page[(occupancy, "Block Limit Warps")]),
        "blocks per SM": float(page[(occupancy, "Block Limit SM")]),
    }
    stats = "Launch Statistics"
    assert launch.registers_per_thread == int(page[(stats, "Registers Per Thread")])
    assert launch.waves == float(page[(stats, "Waves Per SM")])
    assert launch.grid_size == 43 and launch.block_size == 256


def test_a_launch_names_its_stalls_and_what_limits_occupancy() -> None:
    launch = gelu_launch()
    # ncu's own stall rule on this report: "14.2 cycles ... waiting for a scoreboard
    # dependency on a L1TEX ... operation"
    assert [s.reason for s in launch.top_stalls] == [
        "long_scoreboard",
        "no_instruction",
        "short_scoreboard",
    ]
    assert launch.top_stalls[0].warps_per_issue == pytest.approx(14.19, abs=0.01)
    # 8 blocks of 256 threads fill the SM: nothing holds occupancy below its maximum
    assert launch.theoretical_occupancy_pct == 100.0 and launch.occupancy_limiter is None
    assert launch.shared_bank_conflicts == 0 and launch.shared_instructions == 0
    assert launch.global_load_sectors == 1376 and launch.global_load_requests == 344
    assert launch.dram_bytes == pytest.approx(47104.0)


def test_ncus_messages_around_the_table_are_left_out() -> None:
    log = (REPORTS / "gelu_naive.log").read_text(encoding="utf-8")
    table = recorded("gelu_naive.raw.csv")
    mixed = log + table + "\n==PROF== Disconnected from process 1059\n"
    assert ncu.has_table(mixed) and not ncu.has_table(log)
    (launch,) = ncu.parse_raw_csv(mixed)
    assert launch.kernel.startswith("gelu_tanh")


def test_output_without_a_table_says_why() -> None:
    # written here as ncu prints it on a machine that restricts the counters to admins
    denied = (
        "==PROF== Connected to process 4242\n"
        "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
        "Performance Counters on the target device 0.\n"
    )
    with pytest.raises(ncu.NcuOutputError, match="ERR_NVGPUCTRPERM"):
        ncu.parse_raw_csv(denied)
    assert "admin" in ncu.failure_reason(denied)
    assert ncu.failure_reason("") == "ncu printed no metrics and no error"
    log = (REPORTS / "gelu_naive.log").read_text(encoding="utf-8")
    assert ncu.failure_reason(log) == "ncu printed no metrics and no error"


def test_the_small_naive_gelu_is_launch_bound_as_ncu_says() -> None:
    profile = Profile(
        workload_uuid="w0", label="n=11000", launches=[gelu_launch()], minimum_bytes=88000
    )
    call = classify(profile, peaks=peaks_for("NVIDIA H200"))
    assert call is not None and call.kind is Bottleneck.LAUNCH
    assert "too small to fill" in sol_rule("gelu_naive")  # ncu's own verdict
    assert call.evidence[0].startswith("2.4 us of GPU time in 1 launch(es)")
    assert call.roofline_side == "memory"  # counted no FLOPs: left of any ridge
    # timed at 6.4 us by the gate, the kernel ran for less than half of the call
    timed = classify(profile, latency_ms=0.0064, peaks=peaks_for("NVIDIA H200"))
    assert timed is not None and "the GPU idles between launches" in timed.evidence[0]


def test_the_same_launch_timed_longer_is_latency_bound() -> None:
    # the gelu launch's counters, stretched to a 40 us call: no longer launch-sized, and no
    # unit busy, so warps wait (on the long scoreboard) and the grid leaves SMs idle
    launch = gelu_launch().model_copy(update={"duration_ns": 40_000.0})
    profile = Profile(launches=[launch], minimum_bytes=88000)
    call = classify(profile, latency_ms=0.045)
    assert call is not None and call.kind is Bottleneck.LATENCY
    text = " ".join(call.evidence)
    assert "no unit busy" in text and "long_scoreboard 14.19" in text
    assert "0.04 waves: the grid leaves SMs idle" in text
    assert call.arithmetic_intensity is None  # no peaks given: no roofline


def test_the_bf16_gemm_expert_is_compute_bound_on_ncus_details() -> None:
    # its details page's figures, read into a launch (the raw page was not kept)
    launch = gemm_launch()
    call = classify(Profile(launches=[launch]), peaks=peaks_for("NVIDIA H200"))
    assert call is not None and call.kind is Bottleneck.COMPUTE
    assert "Compute is more heavily utilized than Memory" in sol_rule("gemm_bf16")
