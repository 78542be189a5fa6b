"""Nsight Compute's command line: the metrics the profile stage asks for, the command that
collects them, and its `--csv --page raw` output read back as numbers per launch.

The metric list is small and explicit (not `--set full`): every metric costs replay passes of
the kernel, and a handful of passes is what one profile per verdict can afford. Each name is
one Nsight Compute reports on sm_90 (checked against `--set full` reports of the H200,
tests/fixtures/ncu/).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field

NCU_ENV = "KLINEAGE_NCU"
"""Environment variable naming the ncu executable to use (default: `ncu` on PATH)."""


STALL_REASONS = (
    "barrier",
    "branch_resolving",
    "dispatch_stall",
    "drain",
    "gmma",
    "imc_miss",
    "lg_throttle",
    "long_scoreboard",
    "math_pipe_throttle",
    "membar",
    "mio_throttle",
    "misc",
    "no_instruction",
    "not_selected",
    "selected",
    "short_scoreboard",
    "sleeping",
    "tex_throttle",
    "wait",
)
"""Warp states a warp can be in instead of issuing (Nsight Compute's warp-state names)."""


def stall_metric(reason: str) -> str:
    """Warps stalled for `reason` per issued instruction (the Warp State Statistics section)."""
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


# the metrics, by what they tell the profile stage
DURATION = "gpu__time_duration.sum"
DRAM_PCT = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
L2_PCT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L1_PCT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
MEMORY_PCT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
SM_PCT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
TENSOR_PCT = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
OCCUPANCY_LIMITS = {
    "registers": "launch__occupancy_limit_registers",
    "shared memory": "launch__occupancy_limit_shared_mem",
    "block size": "launch__occupancy_limit_warps",
    "blocks per SM": "launch__occupancy_limit_blocks",
}
"""Blocks per SM each resource allows; the smallest is the occupancy limiter."""
GRID_SIZE = "launch__grid_size"
BLOCK_SIZE = "launch__block_size"
REGISTERS = "launch__registers_per_thread"
WAVES = "launch__waves_per_multiprocessor"
BANK_CONFLICTS = (
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
)
DRAM_BYTES = ("dram__bytes_read.sum", "dram__bytes_write.sum")
GLOBAL_LOAD_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
GLOBAL_LOAD_REQUESTS = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
SHARED_INSTRUCTIONS = (
    "smsp__sass_inst_executed_op_shared_ld.sum",
    "smsp__sass_inst_executed_op_shared_st.sum",
)
"""Warp-level shared-memory load and store instructions."""
FP32_OPS = {
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 1,
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 2,
}
"""FP32 instructions executed per thread, and the FLOPs each is worth."""
FP16_OPS = {
    "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum": 2,
    "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum": 2,
    "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": 4,
}
"""Packed half instructions (two lanes each), and the FLOPs each is worth."""

PROFILE_METRICS: tuple[str, ...] = (
    DURATION,
    DRAM_PCT,
    L2_PCT,
    L1_PCT,
    MEMORY_PCT,
    SM_PCT,
    TENSOR_PCT,
    ACHIEVED_OCCUPANCY,
    THEORETICAL_OCCUPANCY,
    *OCCUPANCY_LIMITS.values(),
    GRID_SIZE,
    BLOCK_SIZE,
    REGISTERS,
    WAVES,
    *BANK_CONFLICTS,
    *DRAM_BYTES,
    GLOBAL_LOAD_SECTORS,
    GLOBAL_LOAD_REQUESTS,
    *SHARED_INSTRUCTIONS,
    *FP32_OPS,
    *FP16_OPS,
    *(stall_metric(reason) for reason in STALL_REASONS),
)
"""Everything the profile stage collects per launch."""


class NcuOutputError(ValueError):
    """ncu's output holds no table of metrics (the message says what it held instead)."""


@dataclass
class RawLaunch:
    """One profiled launch as ncu's raw page gives it: metric name -> number."""

    kernel: str
    """The kernel's (demangled) name."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numeric metrics in the units of `units`."""
    units: dict[str, str] = field(default_factory=dict)
    """Metric name -> unit as ncu printed it ('%', 'byte', 'nsecond', '' for counts)."""

    def get(self, name: str) -> float | None:
        """The metric's value, None when the report lacks it (or it was 'n/a')."""
        return self.metrics.get(name)


def find_ncu() -> str | None:
    """The ncu executable: $KLINEAGE_NCU, else `ncu` on PATH; None when there is none."""
    named = os.environ.get(NCU_ENV)
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return shutil.which("ncu")


def ncu_command(
    ncu: str, target: Sequence[str], log_file: str, metrics: Sequence[str] = PROFILE_METRICS
) -> list[str]:
    """The command that profiles the launches `target` makes between cudaProfilerStart and
    cudaProfilerStop (`--profile-from-start off`: the inputs' set-up and an untimed first
    call are left out) and writes the raw page as CSV (base units) to `log_file`. Clocks are
    left as they are (`--clock-control none`): the gate times at the clocks the GPU runs at,
    and some machines refuse to lock them."""
    return [
        ncu,
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(metrics),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--log-file",
        log_file,
        *target,
    ]


_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_TIME_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}
_TIME_NS |= {"s": 1e9, "second": 1e9}


def to_base(value: float, unit: str) -> tuple[float, str]:
    """A value in ncu's printed unit as bytes or nanoseconds (its SI prefixes undone: 1 Kbyte
    is 1000 bytes), so reports printed with `--print-units auto` read like `base` ones."""
    if unit in _TIME_NS:
        return value * _TIME_NS[unit], "nsecond"
    match = re.fullmatch(r"([KMGT]?)byte", unit)
    if match:
        return value * _SCALE[match.group(1)], "byte"
    return value, unit


_NUMBER = re.compile(r"^[+-]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?([eE][+-]?\d+)?$")


def _number(text: str) -> float | None:
    """A metric cell as a number; None for 'n/a', empty cells and text."""
    cell = text.strip()
    if not _NUMBER.match(cell):
        return None
    return float(cell.replace(",", ""))


def _table_lines(text: str) -> list[str]:
    """The CSV lines of ncu's output: its own messages (==PROF==, ==WARNING==, ...) and the
    application's output are left out."""
    return [line for line in text.splitlines() if line.startswith('"')]


def has_table(text: str) -> bool:
    """Whether `text` holds a metrics table (a header row naming the kernel column)."""
    return any('"Kernel Name"' in line for line in _table_lines(text))


def parse_raw_csv(text: str) -> list[RawLaunch]:
    """The launches of a `--csv --page raw` export, in profiling order. The first row names
    the columns, the second gives their units, each later row is one launch."""
    lines = _table_lines(text)
    if len(lines) < 2:
        raise NcuOutputError(f"no metrics table in ncu's output: {failure_reason(text)}")
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, units = rows[0], rows[1]
    if "Kernel Name" not in header:
        raise NcuOutputError("ncu's table has no 'Kernel Name' column: not a raw page export")
    name_at = header.index("Kernel Name")
    launches = []
    for row in rows[2:]:
        if len(row) != len(header):
            continue  # a torn line, e.g. a run killed mid-write
        launch = RawLaunch(kernel=row[name_at])
        for column, unit, cell in zip(header, units, row, strict=True):
            value = _number(cell)
            if value is not None and "__" in column:  # metric names have a double underscore
                launch.metrics[column], launch.units[column] = to_base(value, unit)
        launches.append(launch)
    return launches


_REASONS = (
    (
        "ERR_NVGPUCTRPERM",
        "ncu may not read the GPU's performance counters here (ERR_NVGPUCTRPERM: counters "
        "are restricted to admin users on this machine)",
    ),
    ("No kernels were profiled", "ncu profiled no kernel launch"),
    ("Failed to find metric", "ncu does not know a metric the profile stage asks for"),
    ("not supported on this", "ncu does not support this GPU"),
)


def failure_reason(text: str) -> str:
    """Why ncu collected nothing, in words, from its messages."""
    for marker, reason in _REASONS:
        if marker in text:
            detail = next((line for line in text.splitlines() if marker in line), "")
            return f"{reason}: {detail.strip()}" if detail.strip() != marker else reason
    errors = [line.strip() for line in text.splitlines() if line.startswith("==ERROR==")]
    return errors[0] if errors else "ncu printed no metrics and no error"
