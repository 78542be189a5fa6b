"""`klineage new`: a problem folder guessed from a kernel's run(...), valid as written, with a
reference that raises until it is filled in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from klineage.cli import app
from klineage.formats.scaffold import ScaffoldError, new_problem
from klineage.gate.inputs import ReferenceFailure, make_inputs, run_reference
from klineage.mechanisms import get
from klineage.problem import load_problem
from tests.conftest import FIXTURES

KERNEL = FIXTURES / "kernels" / "scale_rows" / "correct.cu"


def test_the_signature_gives_inputs_outputs_axes_and_a_workload(tmp_path: Path) -> None:
    made = new_problem("scale", KERNEL, tmp_path / "scale")
    definition = made.problem.definition
    assert list(definition.inputs) == ["x", "alpha"] and list(definition.outputs) == ["y"]
    assert definition.inputs["alpha"].shape is None
    assert definition.inputs["x"].shape == ["rows", "cols"] and definition.var_axes() == [
        "rows",
        "cols",
    ]
    assert (tmp_path / "scale" / "kernel.cu").read_text() == KERNEL.read_text()
    assert "reference" in (tmp_path / "scale" / "TODO.md").read_text()
    with pytest.raises(ReferenceFailure, match="fill in the PyTorch reference"):
        inputs = make_inputs(definition, made.problem.workloads[0], 0, "cpu")
        run_reference(definition, inputs)


def test_the_to_do_list_names_the_scalar_inputs_to_set_and_only_those(tmp_path: Path) -> None:
    with_scalar = new_problem("scale", KERNEL, tmp_path / "scale").todo
    assert any("the values of alpha (guessed 1.0)" in item for item in with_scalar)
    kernel = tmp_path / "copy.cu"
    kernel.write_text(
        '#include <cstdint>\n#include <cuda_runtime.h>\nextern "C" int run(const float* x, '
        "float* y, int64_t n, cudaStream_t stream) { return 0; }\n"
    )
    without = new_problem("copy", kernel, tmp_path / "copy").todo
    assert not any("values of" in item or "scalar" in item for item in without)


def test_filling_in_the_reference_gives_a_working_problem(tmp_path: Path) -> None:
    folder = new_problem("scale", KERNEL, tmp_path / "scale").problem.root
    path = folder / "definition.json"
    data = json.loads(path.read_text())
    data["reference"] = "import torch\n\n\ndef run(x, alpha):\n    return x * alpha\n"
    path.write_text(json.dumps(data))
    problem = load_problem(folder)
    inputs = make_inputs(problem.definition, problem.workloads[0], 0, "cpu")
    assert run_reference(problem.definition, inputs)["y"].shape == (1024, 1024)


def test_a_run_without_a_stream_or_with_inputs_after_outputs_is_refused(tmp_path: Path) -> None:
    no_stream = tmp_path / "a.cu"
    no_stream.write_text('extern "C" int run(const float* x, float* y, int64_t n) { return 0; }\n')
    with pytest.raises(ScaffoldError, match="must end with a cudaStream_t"):
        new_problem("a", no_stream, tmp_path / "a")
    swapped = tmp_path / "b.cu"
    swapped.write_text(
        'extern "C" int run(float* y, const float* x, int64_t n, cudaStream_t s) { return 0; }\n'
    )
    with pytest.raises(ScaffoldError, match="an input after an output"):
        new_problem("b", swapped, tmp_path / "b")


def test_new_on_the_command_line_lists_what_is_left(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["new", "scale", "--kernel", str(KERNEL), "--out", str(tmp_path / "s")]
    )
    assert result.exit_code == 0, result.output
    assert "still to do" in result.output and "klineage gate" in result.output
    again = CliRunner().invoke(
        app, ["new", "scale", "--kernel", str(KERNEL), "--out", str(tmp_path / "s")]
    )
    assert again.exit_code == 2 and "already holds" in again.output


def test_headers_kept_beside_the_kernel_come_along_and_the_others_are_to_do(
    tmp_path: Path,
) -> None:
    source = tmp_path / "src"
    (source / "common").mkdir(parents=True)
    (source / "common" / "vec.h").write_text('#pragma once\n#include "lanes.h"\n')
    (source / "common" / "lanes.h").write_text("#pragma once\n#define LANES 32\n")
    (tmp_path / "shared.h").write_text("#pragma once\n#define SHARED 1\n")
    kernel = source / "scale.cu"
    kernel.write_text(
        '#include "common/vec.h"\n#include "../shared.h"\n#include "missing.h"\n'
        + KERNEL.read_text()
    )
    made = new_problem("scale", kernel, tmp_path / "scale")
    folder = made.problem.root
    assert (folder / "common" / "vec.h").read_text() == (source / "common/vec.h").read_text()
    assert (folder / "common" / "lanes.h").is_file()
    outside = [item for item in made.todo if "shared.h" in item]
    assert len(outside) == 1 and f'"-I{tmp_path.resolve()}"' in outside[0]
    (missing,) = [item for item in made.todo if "missing.h" in item]
    assert "compile_options.json" in missing
    # the copied headers are read from the new folder, and the build finds them there
    assert made.problem.kernel_source().parsed.integer_constants["LANES"] == 32
    assert made.problem.build_options.cuda_cflags == (f"-I{folder.resolve()}",)


def test_inlined_headers_make_what_a_helper_holds_the_kernels_own(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "pack.h").write_text(
        "#pragma once\n"
        "__device__ float4 load4(const float* at) {\n"
        "  return *reinterpret_cast<const float4*>(at);\n"
        "}\n"
    )
    kernel = source / "scale.cu"
    kernel.write_text('#include "pack.h"\n' + KERNEL.read_text())
    made = new_problem("scale", kernel, tmp_path / "scale", inline_headers=True)
    written = (made.problem.root / "kernel.cu").read_text()
    assert '#include "pack.h"' not in written and "__device__ float4 load4" in written
    assert not (made.problem.root / "pack.h").exists()
    assert made.problem.build_options == made.problem.compile_options
    sites = get("vectorized_access").detect(made.problem.kernel_source())
    assert [s.function for s in sites] == ["load4"] and sites[0].supported
    again = tmp_path / "again"
    arguments = ["new", "again", "--kernel", str(kernel), "--out", str(again), "--inline-headers"]
    result = CliRunner().invoke(app, arguments)
    assert result.exit_code == 0, result.output
    assert "__device__ float4 load4" in (again / "kernel.cu").read_text()
