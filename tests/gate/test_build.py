"""Build stage: nvcc, the content-addressed cache, error rendering, ptxas reports."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar, cast

import pytest

import klineage
from klineage.gate import sass
from klineage.gate.build import (
    Builder,
    BuildResult,
    BuildStatus,
    BuildToolError,
    FailureKind,
    arch_flags,
    default_cache_dir,
    render_compile_errors,
)
from klineage.problem import CompileOptions

F = TypeVar("F", bound=Callable[..., object])


def needs_nvcc(fn: F) -> F:
    """Mark a test as needing nvcc, skipping it cleanly where nvcc is absent."""
    skip = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
    return cast(F, pytest.mark.nvcc(skip(fn)))


def kernel(body: str = "", tag: str = "") -> str:
    """A small valid kernel file; `tag` makes the source (and so the cache key) unique."""
    return textwrap.dedent(
        f"""\
        // {tag}
        __global__ void scale(float* x, float a, long n) {{
            long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
            if (i < n) x[i] *= a;
        }}
        {body}
        extern "C" int run(float* x, float a, long n) {{
            scale<<<(n + 255) / 256, 256>>>(x, a, n);
            return 0;
        }}
        """
    )


def mtimes(entry: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}


# ------------------------------------------------------------------ no nvcc needed


def test_missing_nvcc_is_a_clear_error(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path, nvcc="klineage-no-such-nvcc")
    with pytest.raises(BuildToolError, match="not on PATH") as info:
        _ = builder.nvcc_version
    assert "CUDA toolkit" in str(info.value) and "nvcc=" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    with pytest.raises(BuildToolError):
        builder.build(kernel())
    with pytest.raises(BuildToolError):
        builder.build_many([kernel()])


def test_arch_and_flags(tmp_path: Path) -> None:
    assert arch_flags("sm_90") == ["-arch=sm_90"]
    assert arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(ValueError):
        arch_flags("hopper")
    builder = Builder(cache_dir=tmp_path, arch="sm_90a", extra_flags=["-lineinfo"])
    assert builder.command == [
        "nvcc",
        "-O3",
        "-std=c++17",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-Xptxas",
        "-v",
        "-Xlinker",
        "--no-undefined",
        "-lineinfo",
        "-o",
        "kernel.so",
        "kernel.cu",
    ]
    # a problem's compile options come last: nvcc flags, host flags, then what the link needs
    options = CompileOptions(
        cflags=("-DNDEBUG",), cuda_cflags=("-DTILE=4",), ld_flags=("-lcuda", "-Wl,--as-needed")
    )
    linked = builder.with_options(options).command
    assert linked[linked.index("-lineinfo") + 1 : -3] == [
        "-DTILE=4",
        "-Xcompiler",
        "-DNDEBUG",
        "-lcuda",
        "-Xlinker",
        "--as-needed",
    ]
    device = Builder(cache_dir=tmp_path, device_only=True, options=options).command
    assert "-lcuda" not in device and "-DTILE=4" in device  # a cubin links nothing


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert Builder().cache_dir == tmp_path / "c"
    monkeypatch.delenv("KLINEAGE_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "klineage" / "build"


# Captured nvcc 13.0 output for CAPTURED_SOURCE, plus ptxas errors from other builds.
CAPTURED_LOG = """\
kernel.cu(2): error: identifier "undefined_thing" is undefined
  __attribute__((global)) void k(float* p) { int unused = 3; p[0] = (1 + undefined_thing); }
                                                                         ^

kernel.cu(3): error: identifier "yy" is undefined
   __attribute__((device)) __inline__ __attribute__((always_inline)) float f(float x) { return yy; }
                                                                                               ^

2 errors detected in the compilation of "kernel.cu".
ptxas nvcc-tmp/tmpxft_00000cf8_00000000-6_kernel.ptx, line 27; error   : Unknown modifier '.x'
ptxas error   : Entry function '_Z3bigPf' uses too much shared data (0x13880 bytes, 0xc000 max)
ptxas fatal   : Ptx assembly aborted due to errors
"""

CAPTURED_SOURCE = """\
#define BAD(x) (x + undefined_thing)
__global__ void k(float* p) { int unused = 3; p[0] = BAD(1); }
\t__device__ __forceinline__ float f(float x) { return yy; }
"""


def test_render_compile_errors_from_captured_log() -> None:
    message = render_compile_errors(CAPTURED_LOG, CAPTURED_SOURCE, "softmax.cu")
    blocks = message.split("\n\n")
    # Macro expansion defeats column mapping: show what nvcc saw, caret under it.
    assert blocks[0].splitlines()[:2] == [
        'softmax.cu:2: error: identifier "undefined_thing" is undefined',
        "    2 | __global__ void k(float* p) { int unused = 3; p[0] = BAD(1); }",
    ]
    seen, caret = blocks[0].splitlines()[2:4]
    assert "as seen by nvcc:" in seen and seen[caret.index("^") :].startswith("undefined_thing")
    # Rewritten qualifiers and a tab: the caret is mapped back onto the original line.
    lines = blocks[1].splitlines()
    assert lines[0] == 'softmax.cu:3: error: identifier "yy" is undefined'
    assert lines[1] == "    3 | \t__device__ __forceinline__ float f(float x) { return yy; }"
    assert lines[2].index("^") == lines[1].index("yy")
    assert blocks[2] == "ptxas error: Unknown modifier '.x' (generated PTX line 27)"
    assert blocks[3].startswith("ptxas error: Entry function '_Z3bigPf'")
    assert "tmpxft" not in message and "nvcc-tmp" not in message
    assert "aborted" not in message  # the fatal line only repeats the errors
    assert len(blocks) == 4


def test_render_falls_back_to_the_log_tail() -> None:
    message = render_compile_errors("something odd\nhappened\n", "", "x.cu", returncode=3)
    assert message.startswith("x.cu: nvcc failed (exit 3)") and message.endswith("happened")


# ---------------------------------------------------------------------- with nvcc


@needs_nvcc
def test_miss_then_hit_then_corrupt_entry_rebuilds(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path / "cache")
    source = kernel(tag="miss-hit")
    first = builder.build(source)
    assert first.ok and not first.cached and first.seconds > 0
    assert first.library is not None and first.library.is_file()
    entry = builder.entry_dir(first.key)
    assert first.library == entry / "kernel.so"
    assert first.library.is_relative_to(tmp_path / "cache")
    stored = json.loads((entry / "result.json").read_text())
    assert stored["library"] == "kernel.so" and stored["status"] == "OK"
    before = mtimes(entry)

    second = Builder(cache_dir=tmp_path / "cache").build(source)
    assert second.ok and second.cached and second.seconds == 0
    assert second.compile_seconds == pytest.approx(first.seconds)
    assert (second.key, second.library) == (first.key, first.library)
    assert second.report == first.report
    assert mtimes(entry) == before  # nothing was rewritten: nvcc did not run

    (entry / "result.json").write_text("{ not json")
    third = builder.build(source)
    assert third.ok and not third.cached and third.key == first.key
    assert builder.build(source).cached


@needs_nvcc
def test_flags_and_arch_invalidate(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = kernel(tag="invalidate")
    base = Builder(cache_dir=cache).build(source)
    flagged = Builder(cache_dir=cache, extra_flags=["-lineinfo"]).build(source)
    older = Builder(cache_dir=cache, arch="sm_80").build(source)
    assert base.ok and flagged.ok and older.ok
    assert not flagged.cached and not older.cached
    assert len({base.key, flagged.key, older.key}) == 3
    assert flagged.command[-4:] == ["-lineinfo", "-o", "kernel.so", "kernel.cu"]
    assert older.report is not None and older.report.kernels[0].arch == "sm_80"
    assert Builder(cache_dir=cache).build(source).cached  # the original entry survives


CONCURRENT_CHILD = """
import json, sys, time
from pathlib import Path
from klineage.gate.build import Builder

cache, sync, index = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
builder = Builder(cache_dir=cache)
builder.nvcc_version  # probe before the race so all children hit the cache together
(sync / f"ready-{index}").touch()
while not (sync / "go").exists():
    time.sleep(0.002)
result = builder.build(Path(sys.argv[4]).read_text())
print(json.dumps({"status": result.status.value, "key": result.key,
                  "cached": result.cached, "library": str(result.library)}))
"""


@needs_nvcc
def test_concurrent_processes_compile_once(tmp_path: Path) -> None:
    sync = tmp_path / "sync"
    sync.mkdir()
    source_file = tmp_path / "k.cu"
    source_file.write_text(kernel(tag="concurrent"))
    env = dict(os.environ)
    root = str(Path(klineage.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    n, cache = 4, tmp_path / "cache"
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_CHILD, *map(str, (cache, sync, i, source_file))],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    deadline = time.monotonic() + 60
    while len(list(sync.glob("ready-*"))) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    (sync / "go").touch()
    outputs = [json.loads(child.communicate(timeout=120)[0]) for child in children]
    assert all(child.returncode == 0 for child in children)
    assert {o["status"] for o in outputs} == {"OK"}
    assert len({o["key"] for o in outputs}) == 1
    assert len({o["library"] for o in outputs}) == 1
    assert sum(not o["cached"] for o in outputs) == 1  # exactly one nvcc run
    assert list((tmp_path / "cache" / "tmp").iterdir()) == []  # no leftovers


@needs_nvcc
def test_threads_building_the_same_source_compile_once(tmp_path: Path) -> None:
    source = kernel(tag="threads")
    results = Builder(cache_dir=tmp_path).build_many([source] * 3, jobs=3)
    assert all(r.ok for r in results)
    assert sum(not r.cached for r in results) == 1


BROKEN = """\
#include <cstdio>

__global__ void scale(float* x, long n) {
    long i = threadIdx.x;
    if (i < n) {
        x[i] = x[i] * factor;
    }
}
extern "C" int run(float* x, long n) { scale<<<1, 32>>>(x, n); return 0; }
"""


@needs_nvcc
def test_compile_error_is_rendered_and_cached(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path / "cache")
    first = builder.build(BROKEN)
    assert first.status is BuildStatus.COMPILE_ERROR and not first.ok
    assert first.failure is FailureKind.NVCC and first.library is None
    lines = first.message.splitlines()
    assert lines[0] == 'kernel.cu:6: error: identifier "factor" is undefined'
    assert lines[1] == "    6 |         x[i] = x[i] * factor;"
    assert lines[2].index("^") == lines[1].index("factor")
    assert 'identifier "factor" is undefined' in first.log
    assert str(tmp_path) not in first.message and "tmp" not in first.message
    assert str(tmp_path) not in first.log
    entry = builder.entry_dir(first.key)
    assert sorted(p.name for p in entry.iterdir()) == ["kernel.cu", "result.json"]

    again = builder.build(BROKEN)
    assert again.cached and again.seconds == 0 and again.status is BuildStatus.COMPILE_ERROR
    assert again.message == first.message
    renamed = builder.build(BROKEN, name="kernels/scale.cu")
    assert renamed.cached
    assert renamed.message.splitlines()[0].startswith("kernels/scale.cu:6: error:")


@needs_nvcc
def test_missing_run_export(tmp_path: Path) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm is not installed, so the export check is skipped by design")
    source = "__global__ void k(float* x) { x[0] = 1; }\nint run(float* x) { return 0; }\n"
    result = Builder(cache_dir=tmp_path).build(source, name="noexport.cu")
    assert result.status is BuildStatus.COMPILE_ERROR and result.failure is FailureKind.MISSING_RUN
    assert result.message.startswith('noexport.cu does not export extern "C" run(...)')
    assert 'extern "C"' in result.message.splitlines()[-1]  # hint about the mangled run
    assert result.library is None and result.report is not None


@needs_nvcc
def test_timeout_is_an_uncached_compile_error(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path, timeout_s=0.05)
    result = builder.build(kernel(tag="timeout"))
    assert result.status is BuildStatus.COMPILE_ERROR and result.failure is FailureKind.TIMEOUT
    assert "timed out after 0.05 s" in result.message
    assert not builder.build(kernel(tag="timeout")).cached
    assert list((tmp_path / "tmp").iterdir()) == []


RESOURCES = """\
template <typename T, int N>
__global__ void tiled(T* out) {
    __shared__ T tile[N];
    tile[threadIdx.x % N] = out[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x + 1) % N];
}
template __global__ void tiled<float, 128>(float*);

__device__ __noinline__ float helper(float v, int k) {
    float a[32];
    for (int i = 0; i < 32; ++i) a[i] = v * i;
    return a[k & 31];
}

__global__ void staged(float* p, int k) {
    __shared__ float s[256];
    s[threadIdx.x] = p[threadIdx.x];
    __syncthreads();
    p[threadIdx.x] = helper(s[255 - threadIdx.x], k);
}

extern "C" __global__ void plain(float* p) { p[threadIdx.x] = 0.f; }

extern "C" int run(float* p, int k) { staged<<<1, 256>>>(p, k); return 0; }
"""

SPILLY = """\
__global__ void spill(float* p, int k) {
    float a[128];
    for (int i = 0; i < 128; ++i) a[i] = p[i * k];
    float s = 0.f;
    for (int i = 0; i < 128; ++i) s += a[(i * k) & 127] * a[i];
    p[0] = s;
}
extern "C" int run(float* p, int k) { spill<<<1, 1>>>(p, k); return 0; }
"""


@needs_nvcc
def test_ptxas_report_from_real_build(tmp_path: Path) -> None:
    result = Builder(cache_dir=tmp_path).build(RESOURCES)
    assert result.ok and result.report is not None
    report = result.report
    assert sorted(k.mangled_name for k in report.kernels) == sorted(
        ["_Z5tiledIfLi128EEvPT_", "_Z6stagedPfi", "plain"]
    )
    assert {k.arch for k in report.kernels} == {"sm_90"}
    staged = report.by_name("staged")
    assert staged is not None and staged.shared_bytes == 256 * 4 and staged.barriers >= 1
    assert staged.registers > 0
    tiled = report.by_name("tiled")
    assert tiled is not None and tiled.shared_bytes == 128 * 4
    if shutil.which("c++filt") or shutil.which("cu++filt"):
        assert tiled.name == "void tiled<float, 128>(float*)"
    assert report.by_name("helper") is None  # a device function is not a kernel
    assert all("helper" not in k.name for k in report.kernels)


@needs_nvcc
def test_ptxas_report_shows_spills(tmp_path: Path) -> None:
    result = Builder(cache_dir=tmp_path, extra_flags=["-maxrregcount=16"]).build(SPILLY)
    assert result.ok and result.report is not None
    (spill,) = result.report.kernels
    assert spill.stack_bytes > 0  # the dynamically indexed array lives in local memory
    assert spill.spill_store_bytes > 0 and result.report.total_spills == spill.spill_bytes


@needs_nvcc
def test_build_many_keeps_order_and_runs_in_parallel(tmp_path: Path) -> None:
    body = "__global__ void only{0}(int* p) {{ p[{0}] = {0}; }}"
    sources = [(kernel(body.format(i)), f"k{i}.cu") for i in range(4)]
    finished: list[tuple[int, float, float]] = []

    def on_done(index: int, result: BuildResult) -> None:
        finished.append((index, time.monotonic() - result.seconds, time.monotonic()))

    results = Builder(cache_dir=tmp_path).build_many(sources, jobs=2, on_done=on_done)
    assert [r.ok for r in results] == [True] * 4
    for i, result in enumerate(results):
        assert result.report is not None and result.report.by_name(f"only{i}") is not None
    assert sorted(i for i, _, _ in finished) == [0, 1, 2, 3]
    # At least two compiles overlapped in time (2 workers).
    spans = sorted((start, end) for _, start, end in finished)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))


@pytest.mark.nvcc
def test_a_wgmma_kernel_is_built_for_sm_90a_automatically(tmp_path: Path) -> None:
    source = (
        "#include <cuda_runtime.h>\n"
        '__global__ void k() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }\n'
        'extern "C" int run(cudaStream_t s) { k<<<1, 128, 0, s>>>(); '
        "return (int)cudaGetLastError(); }\n"
    )
    builder = Builder(cache_dir=tmp_path, arch="sm_90")
    result = builder.build(source, "wgmma.cu")
    assert result.ok, result.message
    assert result.arch == "sm_90a"
    assert any("compute_90a" in flag for flag in result.command)
    plain = builder.build(source.replace("wgmma.fence.sync.aligned;", "nanosleep.u32 1;"))
    assert plain.ok and plain.arch == "sm_90"


# ------------------------------------------------------------------ device-only builds

HOST_ERROR = kernel().replace("return 0;", "return undefined_on_the_host(n);")
HOST_UNUSED = kernel().replace("return 0;", "int blocks = (int)n;\n    return 0;")


def _resources(result: BuildResult) -> list[tuple[str, int, int, int, int]]:
    """The ptxas report less the mangled names (they carry the translation unit's hash)."""
    assert result.report is not None
    return [
        (k.name, k.registers, k.shared_bytes, k.stack_bytes, k.spill_bytes)
        for k in result.report.kernels
    ]


def test_a_gate_refuses_a_device_only_builder(tmp_path: Path) -> None:
    from klineage.gate.gate import Gate

    builder = Builder(cache_dir=tmp_path, device_only=True)
    assert builder.command[-4:] == ["-v", "-o", "kernel.cubin", "kernel.cu"]
    assert "-cubin" in builder.flags and "-shared" not in builder.flags
    assert Builder(cache_dir=tmp_path).key("x") != builder.key("x")
    with pytest.raises(ValueError, match="device-only"):
        Gate(builder)


@needs_nvcc
def test_a_device_only_build_gives_the_full_builds_device_code(tmp_path: Path) -> None:
    """The same SASS, the same ptxas report, no library: what "it compiles" and the SASS
    questions need, at about half the cost (the host compiler never runs)."""
    full = Builder(cache_dir=tmp_path).build(RESOURCES)
    device = Builder(cache_dir=tmp_path, device_only=True)
    result = device.build(RESOURCES, "resources.cu")
    assert result.ok and result.device_only and not full.device_only
    assert result.library is None and result.key != full.key
    assert "-cubin" in result.command and "-shared" not in result.command
    assert sorted(p.name for p in device.entry_dir(result.key).iterdir()) == [
        "kernel.cu",
        "kernel.cubin",
        "result.json",
    ]
    assert _resources(result) == _resources(full)
    code, full_code = result.machine_code, full.machine_code
    assert code is not None and full_code is not None
    assert code.device_fingerprint == full_code.device_fingerprint
    assert [(f.name, f.fingerprint) for f in code.functions] == [
        (f.name, f.fingerprint) for f in full_code.functions
    ]
    # no host side: never the same host launch as anything, not even itself
    assert code.host_fingerprint == "" and not code.same_host(code)
    again = device.build(RESOURCES, "resources.cu")
    assert again.cached and again.ok and again.library is None and again.device_only
    if sass.find_tool("nvdisasm") is not None:
        histograms = device.disassemble(again).machine_code
        assert histograms is not None and histograms.disassembled


@needs_nvcc
def test_a_device_only_build_still_checks_the_host_code(tmp_path: Path) -> None:
    """nvcc's front end parses the whole file in the device pass, so an error in host code is
    a compile error with its line, as in the full build."""
    result = Builder(cache_dir=tmp_path, device_only=True).build(HOST_ERROR, "host.cu")
    assert result.status is BuildStatus.COMPILE_ERROR and result.failure is FailureKind.NVCC
    assert 'host.cu:9: error: identifier "undefined_on_the_host" is undefined' in result.message
    # and it warns about host code too (a rewrite's unused host variable, nvcc's #177)
    unused = Builder(cache_dir=tmp_path, device_only=True).build(HOST_UNUSED)
    assert unused.ok and '#177-D: variable "blocks" was declared but never referenced' in unused.log


@needs_nvcc
def test_instantiated_lines_come_from_a_device_only_lineinfo_build(tmp_path: Path) -> None:
    builder = Builder(cache_dir=tmp_path)
    lines = builder.instantiated_lines(kernel(tag="lines"))
    if sass.find_tool("nvdisasm") is None:
        pytest.skip("needs nvdisasm")
    assert lines and 4 in lines  # `if (i < n) x[i] *= a;`
    (stored,) = [
        BuildResult.model_validate_json(p.read_text()) for p in tmp_path.glob("*/*/result.json")
    ]
    assert stored.device_only and "-lineinfo" in stored.command and "-shared" not in stored.command
