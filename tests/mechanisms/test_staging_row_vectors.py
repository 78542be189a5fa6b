"""Staging row-invariant vectors once per block (smem_staging's forward rule for the form the
once removal takes out): candidates on the removed fixtures, the text the rule writes, the
removal taking it out again, the applied code building and computing what the original does
(threads emulated on the host), and the refusals that name what breaks the form."""

from __future__ import annotations

import re

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, Site, get
from tests.conftest import REPO
from tests.mechanisms.host_emulation import Buffer, Case, run_on_host
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok

staging = get("smem_staging")
FORMS = PUBLIC_FORMS / "smem_staging"
REMOVED = ["row_params", "row_params_float", "cast_once", "persistent_rows"]
HELD_OUT = ["layernorm", "gemv"]
"""The held-out naive kernels with a candidate: one thread per row, each reading a vector."""


def _after(case: str) -> KernelSource:
    return KernelSource((FORMS / f"{case}.after.cu").read_text())


def _candidate(kernel: KernelSource) -> Site:
    (site,) = [c for c in staging.candidates(kernel) if c.detail.get("form") == "row_vectors"]
    return site


def _kernel_part(text: str) -> str:
    return text.split('extern "C"')[0]


@pytest.mark.parametrize("case", REMOVED)
def test_the_removed_fixtures_are_candidates(case: str) -> None:
    site = _candidate(_after(case))
    assert site.supported, site.refusal
    assert site.node_kind == "function_definition"


def _asking_for_smem(kernel: KernelSource) -> KernelSource:
    """The removed state with its launch asking for `smem` bytes again, opted in (a kernel
    whose launch already asks for dynamic shared memory: the removal asks for none once the
    kernel uses none)."""
    text = kernel.text.replace(", 0, stream>>>", ", smem, stream>>>").replace(
        "MaxDynamicSharedMemorySize, 0);", "MaxDynamicSharedMemorySize, (int)smem);"
    )
    assert text.count("smem, stream>>>") == 1 and "(int)smem);" in text
    return KernelSource(text)


def test_packed_vectors_are_staged_and_read_from_the_copy() -> None:
    asking = _asking_for_smem(_after("row_params"))
    applied = staging.apply(asking, _candidate(asking)).text
    assert "extern __shared__ __align__(16) char staged[];" in applied
    assert "Vec4* s_gain = reinterpret_cast<Vec4*>(staged);" in applied
    assert (
        "Vec4* s_bias = reinterpret_cast<Vec4*>(staged) + ((cols + Vec4::size - 1) / Vec4::size);"
        in applied
    )
    assert "s_gain[i / Vec4::size] = load_vec(gain + i);" in applied
    assert "const Vec4 g = s_gain[c / Vec4::size];" in applied
    assert "load_vec(gain + c)" not in applied
    # the copy comes first, before any warp can leave, then the barrier
    body = applied.split("int rows, int cols) {")[1]
    assert body.index("__syncthreads();") < body.index("return;")
    # the launch asks for the copy's bytes on top of what it asked before, opted in
    extra = "2 * ((((int)cols) + Vec4::size - 1) / Vec4::size) * sizeof(Vec4)"
    assert f"dim3(32, kRowsPerBlock), smem + {extra}, stream>>>" in applied
    assert f"cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem + {extra}));" in applied


def test_scalar_vectors_are_staged_a_float_a_slot() -> None:
    applied = staging.apply(_after("row_params_float"), _candidate(_after("row_params_float")))
    text = applied.text
    assert "float* s_bias = reinterpret_cast<float*>(staged) + cols;" in text
    assert "s_gain[i] = gain[i];" in text
    assert "(x[c] - mean) * s_gain[c] + s_bias[c];" in text


def test_a_kernel_with_its_own_dynamic_buffer_moves_its_uses_past_the_copy() -> None:
    after = _after("persistent_rows")
    applied = staging.apply(after, _candidate(after)).text
    shift = "(pool + 2 * ((cols + Quad::size - 1) / Quad::size) * sizeof(Quad))"
    assert applied.count(shift) == 2 and "extern __shared__ char pool[];" in applied
    assert "Quad* s_gain = reinterpret_cast<Quad*>(pool);" in applied


@pytest.mark.parametrize("case", REMOVED)
def test_the_removal_takes_the_staging_out_again(case: str) -> None:
    after = _after(case)
    applied = staging.apply(after, _candidate(after))
    (site,) = [s for s in staging.detect(applied) if s.detail.get("form") == "once"]
    assert site.supported, site.refusal
    again = staging.remove(applied, site).text
    if case == "persistent_rows":
        # the buffer's other uses stay moved, behind a barrier that now orders nothing
        assert "load_quad(gain + c)" in again and "s_gain" not in again
        return
    # the removed state again: with no shared memory left, the launch and its opt-in ask
    # for none, as the removal that wrote the state left them (an opt-in the forward rule
    # added stays, for none)
    assert _kernel_part(again) == _kernel_part(after.text)
    changed = set(again.splitlines()) ^ set(after.text.splitlines())
    assert all(
        line.strip().startswith("cudaFuncSetAttribute(")
        and line.endswith("MaxDynamicSharedMemorySize, 0);")
        and line in again
        for line in changed
    ), changed


def test_no_candidate_is_left_once_staged() -> None:
    after = _after("row_params")
    applied = staging.apply(after, _candidate(after))
    assert not [c for c in staging.candidates(applied) if c.detail.get("form") == "row_vectors"]


def test_a_launch_without_a_size_gets_one_and_the_opt_in() -> None:
    after = _after("row_params_float")
    text = after.text.replace(", 0, stream>>>", ">>>").replace(
        "  cudaFuncSetAttribute(affine_rows_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, "
        "0);\n",
        "",
    )
    assert text.count("cudaFuncSetAttribute") == 0
    applied = staging.apply(KernelSource(text), _candidate(KernelSource(text))).text
    assert "dim3(32, rows_per_block), 2 * ((int)cols) * sizeof(float)>>>" in applied
    assert (
        "  cudaFuncSetAttribute(affine_rows_f32, cudaFuncAttributeMaxDynamicSharedMemorySize, "
        "(int)(2 * ((int)cols) * sizeof(float)));\n  affine_rows_f32<<<"
    ) in applied


@pytest.mark.parametrize(
    ("case", "change", "refusal"),
    [
        (
            "row_params_float",
            (
                "  if (row >= rows) return;\n",
                "  if (row >= rows) return;\n  if (row == 0) const_cast<float*>(bias)[0] = 0.f;\n",
            ),
            "a read of bias, which the kernel writes or moves",
        ),
        (
            "row_params_float",
            (
                "for (int c = threadIdx.x; c < cols; c += 32)\n    out",
                "for (int c = threadIdx.x; c <= cols - 1; c += 32)\n    out",
            ),
            "not a parameter the kernel keeps",
        ),
        (
            "row_params_float",
            (
                "for (int c = threadIdx.x; c < cols; c += 32) sum += x[c];",
                "for (int c = threadIdx.x; c < rows; c += 32) sum += x[c] - gain[c];",
            ),
            "loops to different bounds",
        ),
        (
            "row_params_float",
            ("  affine_rows_f32<<<", "  if (rows > 0) affine_rows_f32<<<"),
            "not a statement of its own",
        ),
        (
            "row_params_float",
            ("MaxDynamicSharedMemorySize, 0);", "MaxDynamicSharedMemorySize, 4096);"),
            "for another size than the launch's",
        ),
        (
            # a pack read at c, with c not always a multiple of the pack's width
            "row_params",
            (
                "  for (int c = threadIdx.x * Vec4::size; c < cols; c += 32 * Vec4::size) {\n"
                "    const Vec4 in = load_vec(x + c);\n    const Vec4 g",
                "  for (int c = threadIdx.x * 2; c < cols; c += 32 * Vec4::size) {\n"
                "    const Vec4 in = load_vec(x + c);\n    const Vec4 g",
            ),
            "not multiples of the",
        ),
        (
            # the copy goes after the buffer's declaration: a return there skips the barrier
            "persistent_rows",
            (
                "  extern __shared__ char pool[];\n",
                "  if (rows == 0) return;\n  extern __shared__ char pool[];\n",
            ),
            "a return before the dynamic buffer",
        ),
    ],
)
def test_a_kernel_out_of_form_is_refused_with_the_reason(
    case: str, change: tuple[str, str], refusal: str
) -> None:
    text = _after(case).text
    changed = text.replace(*change)
    assert changed != text
    site = _candidate(KernelSource(changed))
    assert site.refusal is not None and refusal in site.refusal, site.refusal
    assert "this rule needs loops over c" in site.refusal
    with pytest.raises(MechanismRefused):
        staging.apply(KernelSource(changed), site)


def test_loops_that_walk_the_grid_or_a_single_block_are_no_candidates() -> None:
    # a grid-stride loop reads each element once (its start names the block); a kernel whose
    # accesses are the same in every block has no rows to share the copy between
    grid = """
__global__ void add(float* y, const float* x, const float* b, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = x[i] + b[i];
}
__global__ void one_block(float* y, const float* b, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = b[i];
}
"""
    assert not [
        c for c in staging.candidates(KernelSource(grid)) if c.detail.get("form") == "row_vectors"
    ]


def _host_case(kernel: str, rows: int, cols: int) -> Case:
    return Case(
        axes={"rows": rows, "cols": cols},
        buffers=[
            Buffer("inp", "float", "rows * cols"),
            Buffer("gain", "float", "cols"),
            Buffer("bias", "float", "cols"),
            Buffer("out", "float", "rows * cols", output=True),
        ],
        call=f"{kernel}(out, inp, gain, bias, (int)rows, (int)cols)",
        threads="",
        grid=f"dim3({(rows + 3) // 4})",
        block_dims="dim3(32, 4)",
    )


@pytest.mark.nvcc
@pytest.mark.parametrize(
    ("case", "kernel"), [("row_params", "affine_rows"), ("row_params_float", "affine_rows_f32")]
)
def test_the_staged_kernel_computes_what_the_removed_one_does(case: str, kernel: str) -> None:
    # threads emulated on the host; the dynamic buffer given a fixed size there
    after = _after(case)
    applied = staging.apply(after, _candidate(after)).text
    applied = re.sub(
        r"extern __shared__ __align__\(16\) char staged\[\];",
        "__shared__ __align__(16) char staged[8192];",
        applied,
    )
    cases = [_host_case(kernel, rows, cols) for rows, cols in ((5, 64), (3, 256))]
    assert run_on_host(applied, cases) == run_on_host(after.text, cases)


def test_the_held_out_row_kernels_stage_their_shared_vector() -> None:
    # one thread per row: every thread walks the whole vector (the same element across a
    # warp at once); staged, it is read from shared memory instead. Whether that is faster
    # is the gate's question; the rewrite must only be correct.
    layernorm = KernelSource.from_file(REPO / "heldout" / "layernorm" / "kernel.cu")
    applied = staging.apply(layernorm, _candidate(layernorm)).text
    assert "s_weight[i] = weight[i];" in applied and "__bfloat162float(s_bias[c])" in applied
    body = applied.split("int64_t hidden) {")[1]
    assert body.index("__syncthreads();") < body.index("return;")
    gemv = KernelSource.from_file(REPO / "heldout" / "gemv" / "kernel.cu")
    assert "256, k * sizeof(__nv_bfloat16), stream>>>" in staging.apply(gemv, _candidate(gemv)).text


@pytest.mark.nvcc
def test_the_applied_fixtures_build(mechanism_builder: Builder) -> None:
    sources = []
    for problem in HELD_OUT:
        naive = KernelSource.from_file(REPO / "heldout" / problem / "kernel.cu")
        sources.append(staging.apply(naive, _candidate(naive)))
    for case in REMOVED:
        after = _after(case)
        applied = staging.apply(after, _candidate(after))
        (site,) = [s for s in staging.detect(applied) if s.detail.get("form") == "once"]
        sources += [applied, staging.remove(applied, site)]
    compile_ok(mechanism_builder, sources)
