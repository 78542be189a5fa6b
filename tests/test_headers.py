"""Local headers: a kernel's analysis reads the macros and constants of the headers it
includes (next to it, or in an include folder), as repositories that keep their access
macros in a shared ``utils.h`` need; edits stay in the kernel's own text."""

from __future__ import annotations

import json
import os
from pathlib import Path

from typer.testing import CliRunner

from klineage.cli.main import app
from klineage.cuda.analysis import analysis
from klineage.headers import (
    inline_local_headers,
    local_headers,
    read_repository_file,
    repository_include_dirs,
)
from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all, get
from klineage.mining.plan import plan_walk
from klineage.problem import load_problem
from tests.conftest import REPO

VECTOR_HEADER = """#pragma once
#include <cuda_fp16.h>
#include "lanes.h"
#define VEC4(ref) (reinterpret_cast<float4 *>(&(ref))[0])
#define PAIR(ref) (reinterpret_cast<half2 *>(&(ref))[0])
"""
LANES_HEADER = "#pragma once\n#define LANES 32\n"
SCALE_KERNEL = """#include "vec.h"

__global__ void scale_f32x4(const float *x, float *y, float alpha, int n) {
  int idx = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (idx + 3 < n) {
    float4 reg = VEC4(x[idx]);
    reg.x *= alpha;
    reg.y *= alpha;
    reg.z *= alpha;
    reg.w *= alpha;
    VEC4(y[idx]) = reg;
  }
}
"""


def _repository(root: Path) -> Path:
    """A repository laid out like the public ones: kernels in ``<op>/basic/``, the macros in
    ``<op>/utils/`` (found through ``-I../utils``), another project's utils beside it."""
    utils = root / "kernels" / "scale" / "utils"
    utils.mkdir(parents=True)
    (utils / "vec.h").write_text(VECTOR_HEADER)
    (utils / "lanes.h").write_text(LANES_HEADER)
    other = root / "kernels" / "other" / "utils"
    other.mkdir(parents=True)
    (other / "vec.h").write_text("#pragma once\n")
    kernel = root / "kernels" / "scale" / "basic" / "scale.cu"
    kernel.parent.mkdir(parents=True)
    kernel.write_text(SCALE_KERNEL)
    return kernel


def test_the_nearest_header_folder_of_a_repository_comes_first(tmp_path: Path) -> None:
    kernel = _repository(tmp_path)
    folders = repository_include_dirs(tmp_path, kernel)
    assert folders == (
        tmp_path / "kernels" / "scale" / "utils",
        tmp_path / "kernels" / "other" / "utils",
    )


def test_headers_are_found_through_the_include_folders_nested_ones_first(tmp_path: Path) -> None:
    kernel = read_repository_file(_repository(tmp_path), tmp_path)
    assert kernel.name == "kernels/scale/basic/scale.cu"
    assert [h.name for h in local_headers(kernel)] == ["lanes.h", "vec.h"]
    assert kernel.parsed.integer_constants["LANES"] == 32
    # the same text without a file or include folders reads no header
    assert local_headers(KernelSource(kernel.text)) == ()
    assert "LANES" not in KernelSource(kernel.text).parsed.integer_constants


def test_access_macros_of_a_header_make_vector_sites(tmp_path: Path) -> None:
    kernel = read_repository_file(_repository(tmp_path), tmp_path)
    alone = KernelSource(kernel.text, name="scale.cu")
    assert [s for s in detect_all(alone) if s.mechanism == "vectorized_access"] == []
    sites = [s for s in detect_all(kernel) if s.mechanism == "vectorized_access"]
    assert len(sites) == 2 and all(s.supported for s in sites)


def test_a_walk_removes_and_reapplies_through_the_header(tmp_path: Path) -> None:
    kernel = read_repository_file(_repository(tmp_path), tmp_path)
    plan, last = plan_walk(kernel)
    assert [(s.mechanism, s.transferable, s.exact) for s in plan.steps] == [
        ("vectorized_access", True, True)
    ]
    # edits stay in the kernel's text; its states still read the headers
    assert "VEC4" not in last.text and "#define" not in last.text
    assert last.include_dirs == kernel.include_dirs and last.path == kernel.path
    assert [h.name for h in local_headers(last)] == ["lanes.h", "vec.h"]
    rule = get("vectorized_access")
    (candidate, *_) = rule.candidates(last)
    assert "VEC4(" in rule.apply(last, candidate).text


def test_a_header_next_to_the_kernel_is_found_without_include_folders(tmp_path: Path) -> None:
    (tmp_path / "vec.h").write_text(VECTOR_HEADER.replace('#include "lanes.h"\n', ""))
    (tmp_path / "kernel.cu").write_text(SCALE_KERNEL)
    kernel = KernelSource.from_file(tmp_path / "kernel.cu")
    assert [h.name for h in local_headers(kernel)] == ["vec.h"]
    assert len([s for s in detect_all(kernel) if s.mechanism == "vectorized_access"]) == 2


def test_cycles_missing_and_system_headers_are_passed_over(tmp_path: Path) -> None:
    (tmp_path / "a.h").write_text('#include "b.h"\n#define A 1\n')
    (tmp_path / "b.h").write_text('#include "a.h"\n#include "nowhere.h"\n#define B 2\n')
    (tmp_path / "kernel.cu").write_text(
        '#include <cuda_runtime.h>\n#include "a.h"\n  #  include "a.h"\n'
        '// #include "b.h" is a comment\n__global__ void k() {}\n'
    )
    kernel = KernelSource.from_file(tmp_path / "kernel.cu")
    assert [h.name for h in local_headers(kernel)] == ["b.h", "a.h"]
    assert {"A": 1, "B": 2}.items() <= kernel.parsed.integer_constants.items()


def test_a_header_edited_on_disk_is_read_again(tmp_path: Path) -> None:
    header = tmp_path / "consts.h"
    header.write_text("#define TILE 16\n")
    (tmp_path / "kernel.cu").write_text('#include "consts.h"\n__global__ void k() {}\n')
    first = KernelSource.from_file(tmp_path / "kernel.cu")
    assert first.parsed.integer_constants["TILE"] == 16
    header.write_text("#define TILE 128\n")
    stat = header.stat()
    os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    again = KernelSource.from_file(tmp_path / "kernel.cu")
    assert again.parsed.integer_constants["TILE"] == 128


def test_a_problem_reads_the_headers_of_its_include_flags(tmp_path: Path) -> None:
    utils = tmp_path / "utils"
    utils.mkdir()
    (utils / "vec.h").write_text(VECTOR_HEADER.replace('#include "lanes.h"\n', ""))
    folder = tmp_path / "problem"
    for name in ("definition.json", "workloads.jsonl"):
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes((REPO / "expert_kernels" / "softmax" / name).read_bytes())
    (folder / "kernel.cu").write_text(SCALE_KERNEL)
    (folder / "compile_options.json").write_text(f'{{"cuda_cflags": ["-I{utils}"]}}')
    problem = load_problem(folder)
    assert problem.compile_options.include_dirs == (utils,)
    kernel = problem.kernel_source()
    assert [h.name for h in local_headers(kernel)] == ["vec.h"]
    state = problem.kernel_state(kernel.text.replace("alpha", "beta"))
    assert [h.name for h in local_headers(state)] == ["vec.h"]
    assert state.name == f"{problem.name}.cu"


def test_the_cli_walks_a_repository_with_the_headers_its_build_finds(tmp_path: Path) -> None:
    _repository(tmp_path)
    result = CliRunner().invoke(app, ["mechanisms", "walk", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    plans = {plan["kernel"]: plan for plan in json.loads(result.stdout)}
    steps = plans["kernels/scale/basic/scale.cu"]["steps"]
    assert [(s["mechanism"], s["transferable"]) for s in steps] == [("vectorized_access", True)]


def test_the_cli_reads_a_problem_kernel_with_its_include_flags(tmp_path: Path) -> None:
    utils = tmp_path / "utils"
    utils.mkdir()
    (utils / "vec.h").write_text(VECTOR_HEADER.replace('#include "lanes.h"\n', ""))
    folder = tmp_path / "problem"
    folder.mkdir()
    for name in ("definition.json", "workloads.jsonl"):
        (folder / name).write_bytes((REPO / "expert_kernels" / "softmax" / name).read_bytes())
    (folder / "kernel.cu").write_text(SCALE_KERNEL)
    (folder / "compile_options.json").write_text(f'{{"cuda_cflags": ["-I{utils}"]}}')
    result = CliRunner().invoke(app, ["mechanisms", "detect", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    assert [s["mechanism"] for s in json.loads(result.stdout)] == ["vectorized_access"] * 2


PACKED_HEADER = """#pragma once
template <class T>
struct alignas(16) Pack {
  static constexpr int size = sizeof(int4) / sizeof(T);
  T lanes[size];
};
typedef Pack<float> pack_f32;
template <class T>
__device__ Pack<T> load_pack(const T* at) {
  Pack<T> out;
  *reinterpret_cast<int4*>(out.lanes) = *reinterpret_cast<const int4*>(at);
  return out;
}
template <class T>
__device__ void keep_pack(T* at, Pack<T> value) {
  *reinterpret_cast<int4*>(at) = *reinterpret_cast<const int4*>(value.lanes);
}
"""


def test_packed_types_and_helpers_of_a_header_are_known_the_files_own_first(
    tmp_path: Path,
) -> None:
    (tmp_path / "pack.h").write_text(PACKED_HEADER)
    (tmp_path / "kernel.cu").write_text(
        '#include "pack.h"\n'
        "__device__ float keep_pack(float* at, float value) { return value; }\n"
        "__global__ void twice(const float* x, float* y) {\n"
        "  int i = (blockIdx.x * blockDim.x + threadIdx.x) * pack_f32::size;\n"
        "  pack_f32 v = load_pack(x + i);\n"
        "  y[i] = v.lanes[0] * 2.0f;\n"
        "}\n"
    )
    vectors = analysis(KernelSource.from_file(tmp_path / "kernel.cu").parsed).vectors
    packed = vectors.packed("pack_f32")
    assert packed is not None and (packed.count, packed.bytes) == (4, 16)
    assert vectors.constant("pack_f32::size") == 4
    assert vectors.helpers["load_pack"].kind == "load"
    assert "keep_pack" not in vectors.helpers  # the file's own keep_pack stores nothing
    alone = analysis(KernelSource((tmp_path / "kernel.cu").read_text()).parsed).vectors
    assert alone.packed("pack_f32") is None and not alone.helpers


def test_inlining_writes_each_header_once_in_place_of_its_include(tmp_path: Path) -> None:
    kernel_path = _repository(tmp_path)
    extra = '#include "vec.h"\n#include "lanes.h"\n#include "gone.h"\n'
    kernel_path.write_text(extra + SCALE_KERNEL)
    kernel = read_repository_file(kernel_path, tmp_path)
    text = inline_local_headers(kernel)
    assert "#pragma once" not in text and '#include "vec.h"' not in text
    assert text.count("#define LANES 32") == 1 and text.count("#define VEC4") == 1
    assert text.index("#define LANES") < text.index("#define VEC4")  # nested first
    assert "// lanes.h: inlined above" in text and "// ---- vec.h (inlined) ----" in text
    assert '#include "gone.h"' in text and "#include <cuda_fp16.h>" in text
    inlined = KernelSource(text)
    assert local_headers(inlined) == ()
    assert len([s for s in detect_all(inlined) if s.mechanism == "vectorized_access"]) == 2


def test_a_call_of_a_headers_vector_helper_is_a_site_that_says_how_to_mine_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "pack.h").write_text(PACKED_HEADER)
    (tmp_path / "kernel.cu").write_text(
        '#include "pack.h"\n'
        "__global__ void twice(const float* x, float* y) {\n"
        "  int i = (blockIdx.x * blockDim.x + threadIdx.x) * pack_f32::size;\n"
        "  pack_f32 v = load_pack(x + i);\n"
        "  keep_pack(y + i, v);\n"
        "}\n"
    )
    kernel = KernelSource.from_file(tmp_path / "kernel.cu")
    sites = get("vectorized_access").detect(kernel)
    assert [(s.start_line, s.detail["form"], s.detail["helper"]) for s in sites] == [
        (4, "load", "load_pack"),
        (5, "store", "keep_pack"),
    ]
    assert all(not s.supported for s in sites)
    assert "pack.h defines" in (sites[0].refusal or "")
    assert "--inline-headers" in (sites[0].refusal or "")
    # inlined, the accesses are the kernel's own and removable where the helpers do them
    inlined = KernelSource(inline_local_headers(kernel))
    own = get("vectorized_access").detect(inlined)
    assert own and all(s.supported for s in own)
    assert {s.function for s in own} == {"load_pack", "keep_pack"}
