"""A problem's compile options in real nvcc builds: they reach nvcc (full and device-only
builds) and the cache key, and a kernel that calls a library it does not link fails the build
stage naming the symbol and the flag, instead of building into a library that cannot load.

The TMA fixture (tests/fixtures/problems/tma_copy) calls the driver API's
cuTensorMapEncodeTiled, so it links -lcuda. This machine may have no libcuda.so at all (no
driver, a toolkit without lib64/stubs), so the builds that must link it link a STUB driver
library made here (a test double at the GPU-driver boundary, like the toolkit's own stubs:
it only has to satisfy the linker; nothing here runs the kernel)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli.main import app
from klineage.gate.build import Builder, BuildStatus, FailureKind
from klineage.gate.gate import Gate
from klineage.problem import COMPILE_OPTIONS_FILE, CompileOptions, load_problem
from tests.conftest import FIXTURES

pytestmark = pytest.mark.nvcc

TMA = FIXTURES / "problems" / "tma_copy"
TMA_SOURCE = (TMA / "kernel.cu").read_text()


def _stub_driver(folder: Path, file_name: str) -> Path:
    """A STUB driver library (soname libcuda.so.1) defining the one driver function the TMA
    fixture calls: enough for the linker, never loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "stub_libcuda.c"
    source.write_text("int cuTensorMapEncodeTiled(void) { return 0; }\n")
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("needs a C compiler for the stub driver library")
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", file_name, str(source)],
        cwd=folder,
        check=True,
        capture_output=True,
    )
    return folder / file_name


@pytest.fixture(scope="module")
def stub_driver_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a STUB libcuda.so, as the toolkit's lib64/stubs/ does."""
    return _stub_driver(tmp_path_factory.mktemp("stub-driver"), "libcuda.so").parent


@pytest.fixture(scope="module")
def builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """Full builds in a cache of this module's own (the cache's behaviour is under test)."""
    return Builder(cache_dir=tmp_path_factory.mktemp("options-cache"))


def _with_stub(stub_driver_dir: Path) -> CompileOptions:
    return CompileOptions(ld_flags=(f"-L{stub_driver_dir}", "-lcuda"))


def test_without_lcuda_the_build_fails_naming_the_symbol_and_the_flag(builder: Builder) -> None:
    result = builder.build(TMA_SOURCE, name="tma_copy.cu")
    assert result.status is BuildStatus.COMPILE_ERROR
    assert result.failure is FailureKind.UNRESOLVED_SYMBOL
    assert result.library is None
    assert "cuTensorMapEncodeTiled" in result.message
    assert '"-lcuda"' in result.message and COMPILE_OPTIONS_FILE in result.message
    assert result.message.startswith("tma_copy.cu:")
    again = builder.build(TMA_SOURCE, name="other.cu")  # cached, shown under the new name
    assert again.cached and again.message.startswith("other.cu:")
    assert "cuTensorMapEncodeTiled" in again.message


def test_with_lcuda_it_builds_a_library_that_needs_the_driver(
    builder: Builder, stub_driver_dir: Path
) -> None:
    result = builder.with_options(_with_stub(stub_driver_dir)).build(TMA_SOURCE)
    assert result.ok, result.message
    assert result.library is not None and result.library.is_file()
    assert "-lcuda" in result.command
    assert result.options.ld_flags[-1] == "-lcuda"
    readelf = shutil.which("readelf")
    if readelf is not None:
        dynamic = subprocess.run(
            [readelf, "-d", str(result.library)], capture_output=True, text=True, check=True
        ).stdout
        assert "libcuda.so.1" in dynamic  # loaded from the driver when the harness loads it


def test_a_library_missing_from_the_machine_is_named_and_not_cached(builder: Builder) -> None:
    options = CompileOptions(ld_flags=("-lklineage_no_such_library",))
    first = builder.with_options(options).build(TMA_SOURCE)
    assert first.failure is FailureKind.LIBRARY_NOT_FOUND
    assert "-lklineage_no_such_library" in first.message
    second = builder.with_options(options).build(TMA_SOURCE)
    assert not second.cached  # the machine may get the library: nvcc is asked again


def test_a_driver_with_only_its_versioned_library_links_lcuda(
    builder: Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU machine whose driver has only libcuda.so.1 (a container's driver mount) and a
    toolkit without stubs: -lcuda links against the driver's file, found through ldconfig
    (here the STUB stands in for the driver's library)."""
    import klineage.gate.link

    driver = _stub_driver(tmp_path / "driver", "libcuda.so.1")
    monkeypatch.setattr(klineage.gate.link, "driver_library", lambda: driver)
    linked = builder.with_options(CompileOptions(ld_flags=("-lcuda",)))
    result = linked.build(TMA_SOURCE + "// linked against the driver's own file\n")
    assert result.ok, result.message
    assert result.command == linked.command  # the machine's driver path is not recorded
    assert result.library is not None and not (result.library.parent / "driver-lib").exists()


def test_the_options_are_in_the_cache_key(builder: Builder) -> None:
    link = CompileOptions(ld_flags=("-lcuda",))
    define = CompileOptions(cuda_cflags=("-DKL_TILE=4",))
    host = CompileOptions(cflags=("-DKL_HOST",))
    keys = {builder.with_options(o).key(TMA_SOURCE) for o in (CompileOptions(), link, define, host)}
    assert len(keys) == 4
    device = Builder(cache_dir=builder.cache_dir, device_only=True)
    plain_cubin = device.key(TMA_SOURCE)
    # a cubin links nothing: linker flags leave its key alone, compiler flags do not
    assert device.with_options(link).key(TMA_SOURCE) == plain_cubin
    assert device.with_options(define).key(TMA_SOURCE) != plain_cubin
    assert device.with_options(host).key(TMA_SOURCE) != plain_cubin
    assert builder.with_options(link) is builder.with_options(CompileOptions(ld_flags=("-lcuda",)))
    assert builder.with_options(CompileOptions()) is builder


DEFINED = """\
#ifndef KL_TILE
#error "KL_TILE is not defined"
#endif
__global__ void fill(float* y) { y[threadIdx.x] = KL_TILE; }
extern "C" int run(float* y) { fill<<<1, 32>>>(y); return 0; }
"""


def test_nvcc_flags_reach_a_device_only_build(builder: Builder) -> None:
    device = Builder(cache_dir=builder.cache_dir, device_only=True)
    plain = device.build(DEFINED)
    assert plain.failure is FailureKind.NVCC and "KL_TILE is not defined" in plain.message
    defined = device.with_options(CompileOptions(cuda_cflags=("-DKL_TILE=4",))).build(DEFINED)
    assert defined.ok and defined.device_only, defined.message


HOST_ONLY = """\
#if !defined(__CUDA_ARCH__) && !defined(KL_HOST)
#error "KL_HOST is not defined for the host compiler"
#endif
__global__ void fill(float* y) { y[threadIdx.x] = 1.0f; }
extern "C" int run(float* y) { fill<<<1, 32>>>(y); return 0; }
"""


def test_host_flags_reach_the_host_compiler(builder: Builder) -> None:
    assert "KL_HOST is not defined" in builder.build(HOST_ONLY).message
    built = builder.with_options(CompileOptions(cflags=("-DKL_HOST",))).build(HOST_ONLY)
    assert built.ok, built.message


def _tma_folder(tmp_path: Path, options: CompileOptions | None) -> Path:
    folder = tmp_path / "tma_copy"
    shutil.copytree(TMA, folder)
    (folder / COMPILE_OPTIONS_FILE).unlink()
    if options is not None:
        data = options.model_dump(mode="json", exclude_defaults=True)
        (folder / COMPILE_OPTIONS_FILE).write_text(json.dumps(data))
    return folder


def test_the_gate_builds_with_the_problem_options(
    builder: Builder, stub_driver_dir: Path, tmp_path: Path
) -> None:
    problem = load_problem(_tma_folder(tmp_path, _with_stub(stub_driver_dir)))
    kernel = problem.kernel_source()
    gate = Gate(builder)  # its GPU worker starts only when a kernel is checked
    try:
        built = gate.build(kernel, problem)
        assert built.ok, built.message
        assert built.options == problem.compile_options
        bare = gate.build(kernel, load_problem(_tma_folder(tmp_path / "bare", None)))
        assert bare.failure is FailureKind.UNRESOLVED_SYMBOL
    finally:
        gate.close()


def test_klineage_gate_build_only_says_which_flag_is_missing(
    builder: Builder, stub_driver_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(builder.cache_dir))
    runner = CliRunner()
    bare = runner.invoke(app, ["gate", str(_tma_folder(tmp_path, None)), "--build-only"])
    assert bare.exit_code == 1
    flat = " ".join(bare.output.split())
    assert "cuTensorMapEncodeTiled" in flat and '"-lcuda"' in flat
    linked = _tma_folder(tmp_path / "linked", _with_stub(stub_driver_dir))
    ok = runner.invoke(app, ["gate", str(linked), "--build-only"])
    assert ok.exit_code == 0, ok.output
