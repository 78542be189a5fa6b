"""The float16 attention expert (expert_kernels/fmha_fp16).

CPU: the folder validates, the reference runs, the kernel builds for sm_90 without spills,
and its mechanisms.json ranges point at the code they name. The kernel was written without a
GPU at hand, so its index math is also run here: a numpy model of one block that follows
kernel.cu step by step (the same lane roles, swizzle, tile loads with zero-fill, ring slots,
masking, online softmax, half2 packing and epilogue) and executes ldmatrix (plain and .trans)
and mma.sync m16n8k16 as the PTX ISA defines their fragments. The model asserts that global
reads are in bounds, shared memory is read only where written, without bank conflicts and
only from the key tile the loop expects, and that every element of O is written exactly once;
then it compares O with numpy attention.

GPU: the gate passes on every workload.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from klineage.gate.build import Builder
from klineage.gate.inputs import check_reference_outputs, make_inputs, run_reference
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO

FOLDER = REPO / "expert_kernels" / "fmha_fp16"
KERNEL = FOLDER / "kernel.cu"

BM, BN, WARPS = 64, 64, 4
THREADS = WARPS * 32
LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3  # mma group id and thread-in-group of each lane
GARBAGE = np.float16(np.nan).view(np.uint16)  # what unwritten shared memory holds
LOG2E = 1.4426950408889634


def kernel_constant(name: str) -> str:
    match = re.search(rf"constexpr (?:int|float) {name} = ([^;]+);", KERNEL.read_text())
    assert match, name
    return match[1].strip()


def test_constants_match_the_kernel() -> None:
    assert kernel_constant("kBM") == str(BM)
    assert kernel_constant("kBN") == str(BN)
    assert kernel_constant("kWarps") == str(WARPS)
    assert float(kernel_constant("kLog2e").rstrip("f")) == pytest.approx(LOG2E)


# ----------------------------------------------------------------------------- PTX models


def f16(bits: np.ndarray) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float32)


def bits16(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float16).view(np.uint16)


def assert_conflict_free(byte_addrs: np.ndarray, width: int) -> None:
    """One wavefront of `width`-byte shared accesses touches each 4-byte bank at most once."""
    words = (byte_addrs[:, None] // 4 + np.arange(width // 4)[None, :]).ravel()
    banks = words % 32
    assert len(set(banks.tolist())) == len(banks), f"bank conflict: {sorted(banks.tolist())}"


def ldmatrix_x4(smem, written, addr, trans: bool = False) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4[.trans].b16: lane l supplies the address of row l % 8 of
    matrix l // 8. Returns regs[lane, j, e]: without .trans, matrix j's element (lane // 4,
    2 (lane % 4) + e); with .trans, its element (2 (lane % 4) + e, lane // 4)."""
    assert addr.shape == (32,) and np.all(addr % 16 == 0)
    for j in range(4):
        assert_conflict_free(addr[8 * j : 8 * j + 8], 16)
    index = addr[:, None] // 2 + np.arange(8)[None, :]
    assert np.all(written[index]), "ldmatrix read shared memory nobody wrote"
    rows = smem[index]  # [supplying lane, column]
    regs = np.empty((32, 4, 2), dtype=np.uint16)
    for j in range(4):
        for e in range(2):
            if trans:
                regs[:, j, e] = rows[8 * j + 2 * T + e, G]
            else:
                regs[:, j, e] = rows[8 * j + G, 2 * T + e]
    return regs


def a_matrix(a: np.ndarray) -> np.ndarray:
    """The 16x16 A operand that the fragments a[lane, r, e] of m16n8k16 hold."""
    m = np.zeros((16, 16), dtype=np.float32)
    af = f16(a)
    for e in range(2):
        m[G, 2 * T + e] = af[:, 0, e]
        m[G + 8, 2 * T + e] = af[:, 1, e]
        m[G, 2 * T + 8 + e] = af[:, 2, e]
        m[G + 8, 2 * T + 8 + e] = af[:, 3, e]
    return m


def b_matrix(b: np.ndarray) -> np.ndarray:
    """The 16x8 B operand ("col": k = 2t + e, then 8 + 2t + e; n = g) of b[lane, r, e]."""
    m = np.zeros((16, 8), dtype=np.float32)
    bf = f16(b)
    for e in range(2):
        m[2 * T + e, G] = bf[:, 0, e]
        m[2 * T + 8 + e, G] = bf[:, 1, e]
    return m


def c_fragments(c: np.ndarray) -> np.ndarray:
    """acc[lane, 0..3] = (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1) of a 16x8 tile."""
    return np.stack([c[G, 2 * T], c[G, 2 * T + 1], c[G + 8, 2 * T], c[G + 8, 2 * T + 1]], 1)


def mma_16816(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (products exact, fp32 sums)."""
    d = (a_matrix(a).astype(np.float64) @ b_matrix(b).astype(np.float64)).astype(np.float32)
    acc += c_fragments(d)


def pack_half2(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.stack([bits16(lo), bits16(hi)], -1)


def shfl_xor(x: np.ndarray, mask: int) -> np.ndarray:
    return x[LANES ^ mask]


# ----------------------------------------------------------------------------- one block


def swizzle(d: int, row, chunk):
    return row * (d * 2) + ((chunk ^ (row & 7)) << 4)


class Block:
    """Shared memory of one block, with a tag per tile region naming what it holds."""

    def __init__(self, d: int) -> None:
        self.d = d
        self.tile_bytes = BN * d * 2
        self.smem = np.full(4 * BN * d, GARBAGE, dtype=np.uint16)
        self.written = np.zeros(self.smem.size, dtype=bool)
        self.tags: dict[int, tuple] = {}

    def load_tile(self, tile: int, src: np.ndarray, row0: int, rows: int, tag: tuple) -> None:
        d = self.d
        chunks = d // 8
        step = THREADS // chunks
        tid = np.arange(THREADS)
        chunk, r = tid % chunks, tid // chunks
        for i in range(BN // step):
            row = r + i * step
            ok = row0 + row < rows
            start = np.where(ok, (row0 + row) * d + chunk * 8, 0)
            assert np.all(start >= 0) and np.all(start + 8 <= max(src.size, 8))
            data = np.zeros((THREADS, 8), dtype=np.uint16)
            if ok.any():
                data[ok] = src[start[ok, None] + np.arange(8)]
            addr = tile + swizzle(d, row, chunk)
            assert np.all(addr + 16 <= self.smem.size * 2)
            for phase in range(THREADS // 8):
                assert_conflict_free(addr[8 * phase : 8 * phase + 8], 16)
            index = addr[:, None] // 2 + np.arange(8)[None, :]
            assert len(np.unique(index)) == index.size
            self.smem[index] = data
            self.written[index] = True
        self.tags[tile] = tag

    def expect(self, tile: int, tag: tuple) -> None:
        assert self.tags.get(tile) == tag, f"tile at {tile} holds {self.tags.get(tile)}, not {tag}"

    def ldsm(self, addr: np.ndarray, trans: bool = False) -> np.ndarray:
        return ldmatrix_x4(self.smem, self.written, addr, trans)


def model_block(q, k, v, o, writes, seq_q: int, seq_k: int, d: int, bx: int) -> None:
    """kernel.cu's fmha_fwd<d> for block (bx, head): q, k, v, o are one head's flat bits."""
    blk = Block(d)
    tile_bytes = blk.tile_bytes
    dk, dn, sn = d // 16, d // 8, BN // 8
    scale_log2 = np.float32(LOG2E / math.sqrt(d))
    q_tile = 2 * tile_bytes
    q0 = bx * BM
    n_tiles = (seq_k + BN - 1) // BN

    blk.load_tile(q_tile, q, q0, seq_q, ("q",))
    if n_tiles > 0:
        blk.load_tile(0, k, 0, seq_k, ("k", 0))
        blk.load_tile(tile_bytes, v, 0, seq_k, ("v", 0))

    qf = []
    for warp in range(WARPS):
        row = warp * 16 + (LANES & 15)
        blk.expect(q_tile, ("q",))
        qf.append([blk.ldsm(q_tile + swizzle(d, row, kk * 2 + (LANES >> 4))) for kk in range(dk)])

    acc = np.zeros((WARPS, dn, 32, 4), dtype=np.float32)
    m = np.full((WARPS, 2, 32), -np.inf, dtype=np.float32)
    ls = np.zeros((WARPS, 2, 32), dtype=np.float32)
    k_row = (LANES & 7) + ((LANES >> 4) << 3)
    k_chunk = (LANES >> 3) & 1
    v_row, v_chunk = LANES & 15, LANES >> 4

    for it in range(n_tiles):
        slot = it & 1
        if it + 1 < n_tiles:
            nxt = (slot ^ 1) * 2 * tile_bytes
            blk.load_tile(nxt, k, (it + 1) * BN, seq_k, ("k", it + 1))
            blk.load_tile(nxt + tile_bytes, v, (it + 1) * BN, seq_k, ("v", it + 1))
        k_tile = slot * 2 * tile_bytes
        v_tile = k_tile + tile_bytes
        for warp in range(WARPS):
            # the barrier of the next iteration orders these reads before the next copies
            blk.expect(k_tile, ("k", it))
            blk.expect(v_tile, ("v", it))
            s = np.zeros((sn, 32, 4), dtype=np.float32)
            for kk in range(dk):
                for np_ in range(sn // 2):
                    b = blk.ldsm(k_tile + swizzle(d, np_ * 16 + k_row, kk * 2 + k_chunk))
                    mma_16816(s[2 * np_], qf[warp][kk], b[:, 0:2])
                    mma_16816(s[2 * np_ + 1], qf[warp][kk], b[:, 2:4])
            k0 = it * BN
            if k0 + BN > seq_k:
                for j in range(sn):
                    key = k0 + j * 8 + 2 * T
                    s[j][key >= seq_k, 0] = -np.inf
                    s[j][key >= seq_k, 2] = -np.inf
                    s[j][key + 1 >= seq_k, 1] = -np.inf
                    s[j][key + 1 >= seq_k, 3] = -np.inf
            new_m = []
            for half, cols in ((0, [0, 1]), (1, [2, 3])):
                mx = np.maximum(m[warp, half], s[:, :, cols].max(axis=(0, 2)))
                mx = np.maximum(mx, shfl_xor(mx, 1))
                mx = np.maximum(mx, shfl_xor(mx, 2))
                new_m.append(mx)
            for half, cols in ((0, [0, 1]), (1, [2, 3])):
                mx = new_m[half]
                ms = np.where(mx == -np.inf, np.float32(0), mx * scale_log2).astype(np.float32)
                with np.errstate(invalid="ignore"):
                    alpha = np.exp2(m[warp, half] * scale_log2 - ms).astype(np.float32)
                m[warp, half] = mx
                p = np.exp2(s[:, :, cols] * scale_log2 - ms[None, :, None]).astype(np.float32)
                s[:, :, cols] = p
                ls[warp, half] = ls[warp, half] * alpha + p.sum(axis=(0, 2))
                acc[warp][:, :, cols] *= alpha[None, :, None]
            for kk in range(BN // 16):
                pa = np.stack(
                    [
                        pack_half2(s[2 * kk, :, 0], s[2 * kk, :, 1]),
                        pack_half2(s[2 * kk, :, 2], s[2 * kk, :, 3]),
                        pack_half2(s[2 * kk + 1, :, 0], s[2 * kk + 1, :, 1]),
                        pack_half2(s[2 * kk + 1, :, 2], s[2 * kk + 1, :, 3]),
                    ],
                    1,
                )
                for dp in range(dn // 2):
                    addr = v_tile + swizzle(d, kk * 16 + v_row, dp * 2 + v_chunk)
                    b = blk.ldsm(addr, trans=True)
                    mma_16816(acc[warp, 2 * dp], pa, b[:, 0:2])
                    mma_16816(acc[warp, 2 * dp + 1], pa, b[:, 2:4])

    for warp in range(WARPS):
        for half in range(2):
            total = ls[warp, half] + shfl_xor(ls[warp, half], 1)
            total = total + shfl_xor(total, 2)
            with np.errstate(divide="ignore"):
                inv = np.float32(1) / total
            row = q0 + warp * 16 + G + 8 * half
            for j in range(dn):
                col = j * 8 + 2 * T
                ok = row < seq_q
                for e in range(2):
                    index = row[ok] * d + col[ok] + e
                    assert np.all(index < o.size)
                    o[index] = bits16(acc[warp, j, ok, 2 * half + e] * inv[ok])
                    np.add.at(writes, index, 1)


def model_run(q, k, v, batch, heads, seq_q, seq_k, d):
    """run(): the grid (ceil(seq_q / 64), heads, batch) of fmha_fwd<d>."""
    assert d in (64, 128)
    o = np.full(batch * heads * seq_q * d, GARBAGE, dtype=np.uint16)
    writes = np.zeros(o.size, dtype=np.int32)
    for head in range(batch * heads):
        qs = slice(head * seq_q * d, (head + 1) * seq_q * d)
        ks = slice(head * seq_k * d, (head + 1) * seq_k * d)
        o_head, w_head = o[qs], writes[qs]  # views
        for bx in range((seq_q + BM - 1) // BM):
            model_block(q[qs], k[ks], v[ks], o_head, w_head, seq_q, seq_k, d, bx)
    assert np.all(writes == 1), "some element of O was written zero or several times"
    return o


def attention(q, k, v, d):
    qf, kf, vf = (f16(x).astype(np.float64) for x in (q, k, v))
    s = qf @ kf.swapaxes(-1, -2) / math.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ vf


def random_half(shape, seed: int) -> np.ndarray:
    return bits16(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


def assert_close(got_bits: np.ndarray, expected: np.ndarray) -> None:
    got = f16(got_bits).astype(np.float64)
    assert np.all(np.isfinite(got))
    err = np.abs(got - expected)
    bad = (err > 1e-2) & (err > 1e-2 * np.abs(expected))
    assert not bad.any(), f"{bad.sum()} wrong, max error {err.max()}"
    assert err.max() < 4e-3  # well inside the gate's tolerance


# ----------------------------------------------------------------------------- tests


def test_s_accumulators_are_the_a_fragment_of_p() -> None:
    """C fragments of n8 tiles 2kk and 2kk + 1 of S, packed pairwise, are the A fragment of
    k16 slice kk: the reuse the kernel does in registers."""
    p = np.random.default_rng(0).random((16, 16)).astype(np.float32)
    c0, c1 = c_fragments(p[:, :8]), c_fragments(p[:, 8:])
    pa = np.stack(
        [
            pack_half2(c0[:, 0], c0[:, 1]),
            pack_half2(c0[:, 2], c0[:, 3]),
            pack_half2(c1[:, 0], c1[:, 1]),
            pack_half2(c1[:, 2], c1[:, 3]),
        ],
        1,
    )
    assert np.array_equal(a_matrix(pa), p.astype(np.float16).astype(np.float32))


def test_ldmatrix_trans_of_v_gives_the_b_fragments_of_p_v() -> None:
    """V stored [key][d]: the .trans loads at (key = lane & 15, chunk = lane >> 4) are the B
    fragments of two n8 tiles of d for one k16 slice of keys; without .trans they are not."""
    d = 64
    vals = random_half((16, d), 3)
    smem = np.full(16 * d, GARBAGE, dtype=np.uint16)
    for r in range(16):
        for c in range(d // 8):
            start = swizzle(d, r, c) // 2
            smem[start : start + 8] = vals[r, c * 8 : c * 8 + 8]
    written = np.ones(smem.size, dtype=bool)
    for dp in range(d // 16):
        addr = swizzle(d, LANES & 15, dp * 2 + (LANES >> 4))
        b = ldmatrix_x4(smem, written, addr, trans=True)
        assert np.array_equal(b_matrix(b[:, 0:2]), f16(vals[:, dp * 16 : dp * 16 + 8]))
        assert np.array_equal(b_matrix(b[:, 2:4]), f16(vals[:, dp * 16 + 8 : dp * 16 + 16]))
        plain = ldmatrix_x4(smem, written, addr)
        assert not np.array_equal(b_matrix(plain[:, 0:2]), f16(vals[:, dp * 16 : dp * 16 + 8]))


@pytest.mark.parametrize("d", [64, 128])
def test_swizzle_is_a_bijection_and_conflict_free(d: int) -> None:
    r, c = np.meshgrid(np.arange(BN), np.arange(d // 8), indexing="ij")
    offsets = swizzle(d, r, c).ravel()
    assert sorted(offsets.tolist()) == list(range(0, BN * d * 2, 16))
    for first in range(0, BN, 8):
        for chunk in range(d // 8):
            assert_conflict_free(swizzle(d, first + np.arange(8), chunk), 16)
    with pytest.raises(AssertionError, match="bank conflict"):
        assert_conflict_free(np.arange(8) * d * 2, 16)  # unswizzled rows would conflict


MODEL_SHAPES = [
    # (batch, heads, seq, d): one key, partial tiles, several tiles and blocks, both d
    (1, 1, 1, 64),
    (1, 1, 1, 128),
    (1, 1, 33, 128),
    (1, 2, 33, 64),
    (2, 1, 130, 64),
    (1, 1, 129, 128),
]


@pytest.mark.parametrize(("batch", "heads", "seq", "d"), MODEL_SHAPES)
def test_model_of_the_kernel_computes_attention(batch, heads, seq, d) -> None:
    shape = (batch, heads, seq, d)
    q, k, v = (random_half(shape, seed) for seed in (1, 2, 3))
    o = model_run(q.ravel(), k.ravel(), v.ravel(), batch, heads, seq, seq, d)
    assert_close(o.reshape(shape), attention(q, k, v, d))


def test_model_handles_large_scores() -> None:
    """Scores of several hundred (the running max moves by a lot between tiles) stay exact."""
    shape = (1, 1, 100, 64)
    q = bits16(f16(random_half(shape, 4)) * 8)
    k = bits16(f16(random_half(shape, 5)) * 8)
    v = random_half(shape, 6)
    o = model_run(q.ravel(), k.ravel(), v.ravel(), 1, 1, 100, 100, 64)
    assert_close(o.reshape(shape), attention(q, k, v, 64))


# ----------------------------------------------------------------------------- the folder

MECHANISM_SIGNS = {
    "online_softmax": r"alpha|exp2f",
    "tensor_core_mma": r"mma",
    "ldmatrix": r"ldmatrix",
    "cp_async_pipeline": r"cp_async|cp\.async",
    "smem_staging": r"load_tile|cp_async_16",
    "smem_swizzle": r"\^",
    "row_in_registers": r"acc|qf|s\[",
    "fast_math": r"exp2f",
    "launch_bounds": r"__launch_bounds__",
    "restrict_pointers": r"__restrict__",
    "pragma_unroll": r"#pragma unroll",
    "vectorized_access": r"__half2|cp_async_16",
    "launch_size_dispatch": r"head_dim ==",
}


def test_mechanisms_point_at_their_code() -> None:
    lines = KERNEL.read_text().splitlines()
    entries = json.loads((FOLDER / "mechanisms.json").read_text())
    names = [e["mechanism"] for e in entries]
    assert len(names) == len(set(names))
    for required in ("tensor_core_mma", "ldmatrix", "cp_async_pipeline", "smem_swizzle"):
        assert required in names
    for entry in entries:
        start, end = entry["lines"]
        assert 1 <= start <= end <= len(lines), entry
        text = "\n".join(lines[start - 1 : end])
        assert re.search(MECHANISM_SIGNS[entry["mechanism"]], text), (entry, start, end)
        assert entry["family"] and entry["note"]


def test_folder_validates_and_reference_runs_on_cpu() -> None:
    import torch

    problem = load_problem(FOLDER)
    assert problem.kernel_path is not None and problem.probes
    assert len(problem.workloads) == 5
    for workload in [*problem.workloads, *problem.probes]:
        axes = problem.definition.axis_values(workload)
        assert axes["seq_q"] == axes["seq_k"] and axes["head_dim"] in (64, 128)
        size = axes["batch"] * axes["heads"] * axes["seq_q"] * axes["head_dim"] * 2
        assert size <= 1 << 30, workload.uuid
    workload = min(
        problem.probes, key=lambda w: math.prod(problem.definition.axis_values(w).values())
    )
    axes = problem.definition.axis_values(workload)
    inputs = make_inputs(problem.definition, workload, seed=0, device="cpu")
    outputs = run_reference(problem.definition, inputs, axes)
    check_reference_outputs(problem.definition, workload, outputs)
    bits = {
        name: inputs[name].contiguous().view(dtype=torch.int16).numpy().view(np.uint16).ravel()
        for name in "qkv"
    }
    o = model_run(
        bits["q"],
        bits["k"],
        bits["v"],
        axes["batch"],
        axes["heads"],
        axes["seq_q"],
        axes["seq_k"],
        axes["head_dim"],
    )
    reference = outputs["o"].float().numpy().ravel()
    err = np.abs(f16(o) - reference)
    assert not np.any((err > 1e-2) & (err > 1e-2 * np.abs(reference)))


@pytest.mark.nvcc
def test_kernel_builds_for_sm90_without_spills(shared_builder: Builder) -> None:
    assert shared_builder.arch == "sm_90"
    result = shared_builder.build(KERNEL.read_text(), "kernel.cu")
    assert result.ok, result.message
    assert result.report is not None and len(result.report.kernels) == 2
    assert result.report.total_spills == 0
    for kernel in result.report.kernels:
        assert kernel.registers <= 255


@pytest.mark.gpu
@pytest.mark.nvcc
def test_fmha_passes_its_gate_on_every_workload(tmp_path: Path) -> None:
    from klineage.gate.gate import Gate

    problem = load_problem(FOLDER)
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        verdict = gate.run(problem, KernelSource.from_file(problem.kernel_path), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]
