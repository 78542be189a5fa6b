"""The bf16 GEMM expert (expert_kernels/gemm_bf16).

CPU: the folder validates, the reference runs, the kernel builds for sm_90 without spills,
and its mechanisms.json ranges point at the code they name. Because the kernel is written
without a GPU at hand, its index math is also run here on the CPU: a numpy model of the three
device paths that follows kernel.cu step by step (the same addresses, swizzle, lane roles,
predicates, loop bounds and dispatch) and executes ldmatrix and mma.sync as the PTX ISA
defines them. The model asserts that every global read is in bounds, that shared memory is
only read where it was written and without bank conflicts, that the cp.async ring never reads
a stage before its group has completed, and that every element of C is written exactly once;
then it compares C with the product.

GPU: the gate passes on every workload.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from klineage.gate.build import Builder
from klineage.gate.inputs import check_reference_outputs, make_inputs, run_reference
from klineage.kernel import KernelSource
from klineage.problem import load_problem
from tests.conftest import REPO

FOLDER = REPO / "expert_kernels" / "gemm_bf16"
KERNEL = FOLDER / "kernel.cu"
# The numpy model below follows the mma.sync version of the tiled path, kept beside the
# WGMMA expert as its earlier version; the small-M and split-K paths are the same in both.
MODELLED = REPO / "bench" / "gemm_variants" / "mma_sync.cu"

# ----------------------------------------------------------------------------- constants
# (mirroring kernel.cu; test_constants_match_the_kernel keeps them in step)

BM, BN, BK, STAGES, THREADS = 128, 256, 64, 4, 256
WARP_M, WARP_N = 64, 64
MI, NI = WARP_M // 16, WARP_N // 8
A_STAGE = BM * BK * 2
B_STAGE = BN * BK * 2
STAGE = A_STAGE + B_STAGE
SMEM = STAGES * STAGE
C_PITCH = BN * 2 + 16
GROUP_M = 8
SK_WARPS, SK_NT, SK_UNROLL = 8, 4, 4
SK_COLS = SK_NT * 8
GARBAGE = 0x7FC0  # a bf16 NaN: what the model's shared memory holds before it is written

LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3  # mma group id and thread-in-group of each lane


def kernel_constant(name: str) -> str:
    match = re.search(rf"constexpr int {name} = ([^;]+);", MODELLED.read_text())
    assert match, name
    return match[1].strip()


def test_constants_match_the_kernel() -> None:
    expected = {
        "kBM": BM,
        "kBN": BN,
        "kBK": BK,
        "kStages": STAGES,
        "kThreads": THREADS,
        "kWarpTileM": WARP_M,
        "kWarpTileN": WARP_N,
        "kGroupM": GROUP_M,
        "kSkWarps": SK_WARPS,
        "kSkNT": SK_NT,
        "kSkUnroll": SK_UNROLL,
    }
    for name, value in expected.items():
        assert kernel_constant(name).split()[0] == str(value), name
    assert kernel_constant("kCPitch").startswith("kBN * 2 + 16")


# ----------------------------------------------------------------------------- helpers


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def swizzle(row, chunk):
    """kernel.cu swizzle(): byte offset of a 16-byte chunk in a [rows][64] bf16 tile."""
    return row * (BK * 2) + ((chunk ^ (row & 7)) << 4)


def raster(pid: int, tiles_m: int, tiles_n: int) -> tuple[int, int]:
    """kernel.cu's grouped tile order: (tile_m, tile_n) of block `pid`."""
    width = GROUP_M * tiles_n
    group = pid // width
    first_m = group * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)
    local = pid - group * width
    return first_m + local % rows, local // rows


def as_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns to float32 values."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 with round-to-nearest-even, as __float2bfloat16_rn (finite inputs)."""
    u = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def assert_conflict_free(byte_addrs: np.ndarray, width: int) -> None:
    """Shared-memory accesses of `width` bytes by one warp (or one phase of it) touch each
    4-byte bank at most once per wavefront: `byte_addrs` is one wavefront's addresses."""
    words = (byte_addrs[:, None] // 4 + np.arange(width // 4)[None, :]).ravel()
    banks = words % 32
    assert len(set(banks.tolist())) == len(banks), f"bank conflict: {sorted(banks.tolist())}"


def ldmatrix_x4(smem: np.ndarray, addr: np.ndarray, written: np.ndarray) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4.b16 for one warp. `addr[l]` is the byte address lane l
    supplies: row l % 8 of matrix l // 8. Returns regs[lane, j, e]: element e of register j,
    which holds matrix j's row lane // 4, columns 2 * (lane % 4) + e."""
    assert addr.shape == (32,) and np.all(addr % 16 == 0)
    for j in range(4):  # one 8x8 matrix (8 rows of 16 bytes) per wavefront
        assert_conflict_free(addr[8 * j : 8 * j + 8], 16)
    index = addr[:, None] // 2 + np.arange(8)[None, :]  # [lane supplying row, 8 elements]
    assert np.all(written[index]), "ldmatrix read shared memory nobody wrote"
    rows = smem[index]
    regs = np.empty((32, 4, 2), dtype=np.uint16)
    for j in range(4):
        for e in range(2):
            regs[:, j, e] = rows[8 * j + (LANES >> 2), 2 * (LANES & 3) + e]
    return regs


def mma_16816(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, as the PTX ISA lays out the
    fragments: a[lane, r, e] (r = 0..3: (g, 2t+e), (g+8, 2t+e), (g, 2t+8+e), (g+8, 2t+8+e)),
    b[lane, r, e] (k = 2t+e, then 2t+8+e; n = g), acc[lane, 0..3] = (g, 2t), (g, 2t+1),
    (g+8, 2t), (g+8, 2t+1). Leading batch dimensions are allowed."""
    batch = a.shape[:-3]
    am = np.zeros((*batch, 16, 16))
    bm = np.zeros((*batch, 16, 8))
    af, bf = as_f32(a).astype(np.float64), as_f32(b).astype(np.float64)
    for e in range(2):
        am[..., G, 2 * T + e] = af[..., :, 0, e]
        am[..., G + 8, 2 * T + e] = af[..., :, 1, e]
        am[..., G, 2 * T + 8 + e] = af[..., :, 2, e]
        am[..., G + 8, 2 * T + 8 + e] = af[..., :, 3, e]
        bm[..., 2 * T + e, G] = bf[..., :, 0, e]
        bm[..., 2 * T + 8 + e, G] = bf[..., :, 1, e]
    d = am @ bm
    acc[..., 0] += d[..., G, 2 * T]
    acc[..., 1] += d[..., G, 2 * T + 1]
    acc[..., 2] += d[..., G + 8, 2 * T]
    acc[..., 3] += d[..., G + 8, 2 * T + 1]


@dataclass
class Memory:
    """Global memory: A, B, C as bf16 bits and the fp32 workspace, with write counts."""

    a: np.ndarray
    b: np.ndarray
    M: int
    N: int
    K: int
    c: np.ndarray = field(init=False)
    c_writes: np.ndarray = field(init=False)
    w: np.ndarray | None = None
    w_written: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.c = np.full(self.M * self.N, GARBAGE, dtype=np.uint16)
        self.c_writes = np.zeros(self.M * self.N, dtype=np.int32)

    def read8(self, matrix: np.ndarray, start: np.ndarray) -> np.ndarray:
        """16-byte loads (8 bf16) at element offsets `start`; they must be in bounds."""
        start = np.asarray(start)
        assert np.all(start >= 0) and np.all(start + 8 <= matrix.size), "load out of bounds"
        assert np.all(start % 8 == 0), "16-byte load not 16-byte aligned"
        return matrix[start[..., None] + np.arange(8)]

    def store_c(self, index: np.ndarray, bits: np.ndarray) -> None:
        assert np.all(index >= 0) and np.all(index < self.c.size), "store out of bounds"
        np.add.at(self.c_writes, index, 1)
        self.c[index] = bits


# ----------------------------------------------------------------------------- tiled path


def model_tiled(mem: Memory, bx: int, by: int, split: bool, ldw: int, kt_per_split: int):
    M, N, K = mem.M, mem.N, mem.K
    tiles_m, tiles_n = ceil_div(M, BM), ceil_div(N, BN)
    tile_m, tile_n = raster(bx, tiles_m, tiles_n)
    m0, n0 = tile_m * BM, tile_n * BN
    kt_total = ceil_div(K, BK)
    kt_begin = by * kt_per_split
    k_tiles = max(min(kt_per_split, kt_total - kt_begin), 0)

    smem = np.full(SMEM // 2, GARBAGE, dtype=np.uint16)
    written = np.zeros(SMEM // 2, dtype=bool)
    slot_group = [-1] * STAGES  # commit group of the last copy into each slot
    groups = {"committed": 0, "done": 0}

    # make_loader
    tid = np.arange(THREADS)
    chunk, row0 = tid & 7, tid >> 3
    a_rows = np.clip((M - m0 - row0 + 31) // 32, 0, BM // 32)
    b_rows = np.clip((N - n0 - row0 + 31) // 32, 0, BN // 32)
    dst = swizzle(row0, chunk)

    def load_stage(slot: int, kt: int) -> None:
        k0 = kt * BK
        k_ok = k0 + chunk * 8 < K
        base = slot * STAGE
        for operand, count, rows_ok, first_row, src, extra in (
            ("a", BM // 32, a_rows, m0, mem.a, 0),
            ("b", BN // 32, b_rows, n0, mem.b, A_STAGE),
        ):
            for i in range(count):
                ok = k_ok & (i < rows_ok)
                row = first_row + row0 + 32 * i
                start = np.where(ok, row * K + chunk * 8 + k0, 0)  # the base when not ok
                data = np.where(ok[:, None], mem.read8(src, start), 0).astype(np.uint16)
                addr = base + extra + dst + i * 32 * (BK * 2)
                for phase in range(THREADS // 8):  # 8 x 16 bytes per wavefront
                    assert_conflict_free(addr[8 * phase : 8 * phase + 8], 16)
                index = addr[:, None] // 2 + np.arange(8)[None, :]
                assert len(np.unique(index)) == index.size
                smem[index] = data
                written[index] = True
                assert operand in "ab"
        slot_group[slot] = groups["committed"]  # joins the group committed next

    def commit() -> None:
        groups["committed"] += 1

    def wait(pending: int) -> None:
        groups["done"] = max(groups["done"], groups["committed"] - pending)

    for s in range(STAGES - 1):
        if s < k_tiles:
            load_stage(s, kt_begin + s)
        commit()

    acc = np.zeros((8, MI, NI, 32, 4))
    warp = np.arange(8)
    warp_m, warp_n = warp >> 2, warp & 3
    a_row = warp_m[:, None] * WARP_M + (LANES & 15)[None, :]
    a_chunk = np.broadcast_to(LANES >> 4, (8, 32))
    b_row = warp_n[:, None] * WARP_N + ((LANES & 7) + ((LANES >> 4) << 3))[None, :]
    b_chunk = np.broadcast_to((LANES >> 3) & 1, (8, 32))

    for it in range(k_tiles):
        wait(STAGES - 2)
        # __syncthreads(): every warp finished iteration it - 1
        nxt = it + STAGES - 1
        if nxt < k_tiles:
            assert nxt % STAGES != it % STAGES
            load_stage(nxt % STAGES, kt_begin + nxt)
        commit()
        slot = it % STAGES
        assert slot_group[slot] < groups["done"], "stage read before its copies completed"
        a_base = slot * STAGE
        b_base = a_base + A_STAGE
        for ks in range(BK // 16):
            af = np.empty((8, MI, 32, 4, 2), dtype=np.uint16)
            bfr = np.empty((8, NI // 2, 32, 4, 2), dtype=np.uint16)
            for w in range(8):
                for mi in range(MI):
                    addr = a_base + swizzle(a_row[w] + mi * 16, ks * 2 + a_chunk[w])
                    af[w, mi] = ldmatrix_x4(smem, addr, written)
                for nj in range(NI // 2):
                    addr = b_base + swizzle(b_row[w] + nj * 16, ks * 2 + b_chunk[w])
                    bfr[w, nj] = ldmatrix_x4(smem, addr, written)
            b = np.empty((8, NI, 32, 2, 2), dtype=np.uint16)
            for ni in range(NI):
                b[:, ni, :, 0] = bfr[:, ni >> 1, :, (ni & 1) * 2]
                b[:, ni, :, 1] = bfr[:, ni >> 1, :, (ni & 1) * 2 + 1]
            mma_16816(
                acc,
                np.broadcast_to(af[:, :, None], (8, MI, NI, 32, 4, 2)),
                np.broadcast_to(b[:, None], (8, MI, NI, 32, 2, 2)),
            )
    wait(0)

    g, t = G, T
    if split:
        for w in range(8):
            for mi in range(MI):
                row = m0 + warp_m[w] * WARP_M + mi * 16 + g
                for ni in range(NI):
                    col = n0 + warp_n[w] * WARP_N + ni * 8 + 2 * t
                    inside = col < N
                    assert np.all(col[inside] + 1 < ldw)
                    for rows, pair in ((row, (0, 1)), (row + 8, (2, 3))):
                        ok = inside & (rows < M)
                        index = by * M * ldw + rows[ok] * ldw + col[ok]
                        for e in range(2):
                            mem.w[index + e] = acc[w, mi, ni, ok, pair[e]]
                            mem.w_written[index + e] += 1
        return

    smem[:] = GARBAGE
    written[:] = False
    for w in range(8):
        for mi in range(MI):
            r = warp_m[w] * WARP_M + mi * 16 + g
            for ni in range(NI):
                cc = warp_n[w] * WARP_N + ni * 8 + 2 * t
                for rows, pair in ((r, (0, 1)), (r + 8, (2, 3))):
                    addr = rows * C_PITCH + cc * 2
                    assert_conflict_free(addr, 4)
                    assert np.all(addr + 4 <= SMEM)
                    bits = to_bf16_bits(acc[w, mi, ni, :, list(pair)].T)
                    smem[addr // 2] = bits[:, 0]
                    smem[addr // 2 + 1] = bits[:, 1]
                    written[addr // 2] = written[addr // 2 + 1] = True
    vec_ok = N % 8 == 0
    chunks_per_row = BN // 8
    for i0 in range(0, BM * chunks_per_row, THREADS):
        i = i0 + np.arange(THREADS)
        r, ch = i // chunks_per_row, i % chunks_per_row
        for phase in range(THREADS // 8):
            assert_conflict_free((r * C_PITCH + ch * 16)[8 * phase : 8 * phase + 8], 16)
        row, col = m0 + r, n0 + ch * 8
        for lane_i in np.nonzero((row < M) & (col < N))[0]:
            index = (r[lane_i] * C_PITCH + ch[lane_i] * 16) // 2 + np.arange(8)
            assert np.all(written[index]), "epilogue read an unwritten staging slot"
            values = smem[index]
            dst = row[lane_i] * N + col[lane_i]
            if vec_ok:
                assert dst % 8 == 0 and col[lane_i] + 8 <= N
                mem.store_c(dst + np.arange(8), values)
            else:
                keep = col[lane_i] + np.arange(8) < N
                mem.store_c(dst + np.arange(8)[keep], values[keep])


# ----------------------------------------------------------------------------- skinny path


def model_skinny(mem: Memory, bx: int, by: int, split: bool, ldw: int, steps_per_split: int):
    M, N, K = mem.M, mem.N, mem.K
    n0 = bx * SK_COLS
    steps_total = ceil_div(K, 32)
    split_begin = by * steps_per_split
    split_end = min(split_begin + steps_per_split, steps_total)
    per_warp = ceil_div(max(split_end - split_begin, 0), SK_WARPS)
    g, t = G, T
    a0 = np.where(g < M, g, 0) * K + t * 8
    a1 = np.where(g + 8 < M, g + 8, 0) * K + t * 8
    bp = [np.where(n0 + j * 8 + g < N, n0 + j * 8 + g, 0) * K + t * 8 for j in range(SK_NT)]
    partial = np.zeros((SK_WARPS, SK_NT * 4, 32))
    zero = np.zeros((32, 8), dtype=np.uint16)

    def step(acc, av0, av1, bvs):
        for j in range(SK_NT):
            bv = bvs[j]
            for half in (0, 4):  # registers (x, y), then (z, w)
                a = np.stack(
                    [
                        av0[:, half : half + 2],
                        av1[:, half : half + 2],
                        av0[:, half + 2 : half + 4],
                        av1[:, half + 2 : half + 4],
                    ],
                    axis=1,
                )
                b = np.stack([bv[:, half : half + 2], bv[:, half + 2 : half + 4]], axis=1)
                mma_16816(acc[j], a, b)

    for warp in range(SK_WARPS):
        begin = split_begin + warp * per_warp
        end = min(begin + per_warp, split_end)
        acc = np.zeros((SK_NT, 32, 4))
        s = begin
        while s + SK_UNROLL <= end and (s + SK_UNROLL) * 32 <= K:
            for u in range(SK_UNROLL):
                k = (s + u) * 32
                step(
                    acc,
                    mem.read8(mem.a, a0 + k),
                    mem.read8(mem.a, a1 + k),
                    [mem.read8(mem.b, bp[j] + k) for j in range(SK_NT)],
                )
            s += SK_UNROLL
        while s < end:
            k = s * 32
            ok = (k + t * 8 < K)[:, None]
            step(
                acc,
                np.where(ok, mem.read8(mem.a, np.where(ok[:, 0], a0 + k, 0)), zero),
                np.where(ok, mem.read8(mem.a, np.where(ok[:, 0], a1 + k, 0)), zero),
                [
                    np.where(ok, mem.read8(mem.b, np.where(ok[:, 0], bp[j] + k, 0)), zero)
                    for j in range(SK_NT)
                ],
            )
            s += 1
        for j in range(SK_NT):
            for r in range(4):
                partial[warp, j * 4 + r] = acc[j, :, r]

    for o in range(SK_NT * 4 * 32):
        jr, ln = o >> 5, o & 31
        total = partial[:, jr, ln].sum()
        row = (ln >> 2) + (8 if (jr & 3) >= 2 else 0)
        col = n0 + (jr >> 2) * 8 + (ln & 3) * 2 + (jr & 1)
        if row < M and col < N:
            if split:
                index = (by * M + row) * ldw + col
                mem.w[index] = total
                mem.w_written[index] += 1
            else:
                mem.store_c(np.array([row * N + col]), to_bf16_bits(np.array([total])))


# ----------------------------------------------------------------------------- reduce + run


def model_reduce(mem: Memory, ldw: int, splits: int) -> None:
    M, N = mem.M, mem.N
    chunks_per_row = ldw // 8
    for idx in range(M * chunks_per_row):
        row, col = idx // chunks_per_row, (idx % chunks_per_row) * 8
        if col >= N:
            continue
        sums = np.zeros(8)
        for s in range(splits):
            start = (s * M + row) * ldw + col
            assert start % 4 == 0 and start + 8 <= mem.w.size, "workspace read out of bounds"
            keep = col + np.arange(8) < N
            assert np.all(mem.w_written[start : start + 8][keep] == 1), "unwritten partial"
            sums += mem.w[start : start + 8]
        keep = col + np.arange(8) < N
        mem.store_c(row * N + col + np.arange(8)[keep], to_bf16_bits(sums[keep]))


def dispatch(M: int, N: int, K: int, sms: int = 132) -> tuple[str, int, int, int]:
    """run()'s choice: (path, grid.x, splits, per_split)."""
    assert K % 8 == 0
    if M <= 16:
        blocks_n = ceil_div(N, SK_COLS)
        steps = ceil_div(K, 32)
        splits = 1
        if blocks_n < 2 * sms:
            splits = min(min(ceil_div(2 * sms, blocks_n), steps // 16), 16)
        splits = max(splits, 1)
        per_split = ceil_div(steps, splits)
        return "skinny", blocks_n, ceil_div(steps, per_split), per_split
    tiles = ceil_div(M, BM) * ceil_div(N, BN)
    kt_total = ceil_div(K, BK)
    splits = 1
    if tiles < sms:
        splits = min(min(sms // tiles, kt_total // 4), 16)
    splits = max(splits, 1)
    per_split = ceil_div(kt_total, splits)
    return "tiled", tiles, ceil_div(kt_total, per_split), per_split


def model_run(a_bits, b_bits, M, N, K, sms=132, force=None):
    path, grid_x, splits, per_split = force or dispatch(M, N, K, sms)
    ldw = (N + 7) & ~7
    mem = Memory(a_bits.ravel(), b_bits.ravel(), M, N, K)
    if splits > 1:
        mem.w = np.full(splits * M * ldw, np.nan)
        mem.w_written = np.zeros(splits * M * ldw, dtype=np.int32)
    body = model_skinny if path == "skinny" else model_tiled
    for by in range(splits):
        for bx in range(grid_x):
            body(mem, bx, by, splits > 1, ldw, per_split)
    if splits > 1:
        model_reduce(mem, ldw, splits)
    assert np.all(mem.c_writes == 1), "some element of C was written zero or several times"
    return mem.c.reshape(M, N), (path, grid_x, splits, per_split)


def random_bf16(shape: tuple[int, int], seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return to_bf16_bits(values)


def check_product(c_bits, a_bits, b_bits) -> None:
    exact = as_f32(a_bits).astype(np.float64) @ as_f32(b_bits).astype(np.float64).T
    got = as_f32(c_bits).astype(np.float64)
    assert np.all(np.isfinite(got))
    # one bf16 rounding (2^-9 relative) plus float32 accumulation error
    bound = 2.0**-8 * np.abs(exact) + 1e-5 * math.sqrt(a_bits.shape[1]) * 4
    bad = np.abs(got - exact) > bound
    assert not bad.any(), f"{bad.sum()} wrong elements, first at {np.argwhere(bad)[0]}"


MODEL_SHAPES = [
    # (M, N, K, sms): each path, full and partial tiles, split K, unaligned N
    (1, 33, 8, 132),  # skinny, one partial step
    (7, 100, 1032, 132),  # skinny, split K (2 splits), remainder loop only
    (16, 72, 1056, 1),  # skinny, no split: main loop (4-step groups) and the remainder
    (3, 40, 4104, 132),  # skinny, 8 splits, last step partial (K % 32 == 8)
    (130, 260, 520, 132),  # tiled, 2x2 tiles, K tail (520 = 8 * 64 + 8), 2 splits
    (130, 260, 136, 1),  # no split: bf16 epilogue, N % 8 != 0 (element stores)
    (17, 264, 1032, 132),  # tiled, 4 splits (the last one shorter), N % 8 == 0
    (300, 16, 256, 1),  # tiled, 3 tile-rows, 4 full k-tiles, vector epilogue
]


@pytest.mark.parametrize(("M", "N", "K", "sms"), MODEL_SHAPES)
def test_model_of_the_kernel_computes_the_product(M: int, N: int, K: int, sms: int) -> None:
    a, b = random_bf16((M, K), 1), random_bf16((N, K), 2)
    c, _ = model_run(a, b, M, N, K, sms)
    check_product(c, a, b)


def test_model_covers_the_paths_it_claims() -> None:
    paths = {
        dispatch(M, N, K, sms)[0] + ("-split" if dispatch(M, N, K, sms)[2] > 1 else "")
        for M, N, K, sms in MODEL_SHAPES
    }
    assert paths == {"skinny", "skinny-split", "tiled", "tiled-split"}


def test_dispatch_of_the_workloads() -> None:
    """The paths and splits the notes (bench/notes/gemm.md) predict from."""
    expected = {
        (4096, 4096, 4096): ("tiled", 512, 1),
        (1, 28672, 8192): ("skinny", 896, 1),
        (16, 11008, 4096): ("skinny", 344, 1),
        (16, 4096, 11008): ("skinny", 128, 3),
        (128, 11008, 4096): ("tiled", 43, 3),
        (128, 8192, 28672): ("tiled", 32, 4),
        (2048, 28672, 8192): ("tiled", 1792, 1),
        (8192, 11008, 4096): ("tiled", 2752, 1),
    }
    problem = load_problem(FOLDER)
    seen = set()
    for workload in problem.workloads:
        axes = problem.definition.axis_values(workload)
        shape = (axes["M"], axes["N"], axes["K"])
        seen.add(shape)
        assert dispatch(*shape)[:3] == expected[shape], shape
    assert seen == set(expected)


# ----------------------------------------------------------------------------- index math


@pytest.mark.parametrize(
    ("tiles_m", "tiles_n"), [(1, 1), (1, 43), (32, 16), (17, 3), (9, 112), (64, 43), (8, 8)]
)
def test_rasterization_is_a_bijection(tiles_m: int, tiles_n: int) -> None:
    seen = {raster(pid, tiles_m, tiles_n) for pid in range(tiles_m * tiles_n)}
    assert seen == {(m, n) for m in range(tiles_m) for n in range(tiles_n)}


def test_rasterization_keeps_blocks_in_flight_close() -> None:
    """4096^3 has 32 x 16 tiles: the first 128 blocks cover 8 tile-rows by all 16 columns (16
    MB of A, all 32 MB of B, with each A tile-row read by 16 blocks), not 1 row by 128."""
    tiles = [raster(pid, 32, 16) for pid in range(128)]
    assert {m for m, _ in tiles} == set(range(GROUP_M))
    assert {n for _, n in tiles} == set(range(16))
    assert [m for m, _ in tiles[:GROUP_M]] == list(range(GROUP_M))  # down the group first


def test_swizzle_is_a_bijection_on_a_tile() -> None:
    for rows in (BM, BN):
        r, c = np.meshgrid(np.arange(rows), np.arange(8), indexing="ij")
        offsets = swizzle(r, c).ravel()
        assert sorted(offsets.tolist()) == list(range(0, rows * BK * 2, 16))


def test_ldmatrix_rows_are_conflict_free_for_every_row_block() -> None:
    for first in range(0, BN, 8):
        for chunk in range(8):
            assert_conflict_free(swizzle(first + np.arange(8), chunk), 16)


def test_unswizzled_layout_would_conflict() -> None:
    """The swizzle is what makes ldmatrix conflict-free: without it, 8 rows share 4 banks."""
    with pytest.raises(AssertionError, match="bank conflict"):
        assert_conflict_free(np.arange(8) * BK * 2, 16)


def test_smem_budget() -> None:
    assert SMEM == 196608 <= 227 * 1024
    assert BM * C_PITCH <= SMEM


# ----------------------------------------------------------------------------- the folder

MECHANISM_SIGNS = {
    "block_tiling": r"kBM|m0|n0",
    "warp_tiling": r"warp_m|warp_n|kWarpTile|warpgroup|wg",
    "smem_staging": r"cp_async_16|load_stage",
    "packed_half2_math": r"bfloat162",
    "smem_swizzle": r"\^",
    "smem_padding": r"kCPitch",
    "cp_async_pipeline": r"cp_async_wait|cp\.async",
    "ldmatrix": r"ldmatrix",
    "tensor_core_mma": r"mma",
    "vectorized_access": r"uint4|float4|float2",
    "rasterization": r"group",
    "split_k": r"split",
    "launch_size_dispatch": r"m <= 16|splits",
    "restrict_pointers": r"__restrict__",
    "launch_bounds": r"__launch_bounds__",
    "pragma_unroll": r"#pragma unroll",
    "readonly_ldg": r"__ldg",
    "register_fragment_streaming": r"load_stream|mma_bf16_16816",
}


def test_mechanisms_point_at_their_code() -> None:
    lines = KERNEL.read_text().splitlines()
    entries = json.loads((FOLDER / "mechanisms.json").read_text())
    names = [e["mechanism"] for e in entries]
    assert len(names) == len(set(names))
    for required in ("block_tiling", "cp_async_pipeline", "tensor_core_mma", "smem_swizzle"):
        assert required in names
    for entry in entries:
        start, end = entry["lines"]
        assert 1 <= start <= end <= len(lines), entry
        text = "\n".join(lines[start - 1 : end])
        sign = MECHANISM_SIGNS[entry["mechanism"]]
        assert re.search(sign, text), (entry["mechanism"], start, end)
        assert entry["family"] and entry["note"]


def test_folder_validates_and_reference_runs_on_cpu() -> None:
    import torch

    problem = load_problem(FOLDER)
    assert problem.kernel_path is not None and problem.probes
    assert len(problem.workloads) >= 8
    for workload in [*problem.workloads, *problem.probes]:
        axes = problem.definition.axis_values(workload)
        for rows, cols in ((axes["M"], axes["K"]), (axes["N"], axes["K"]), (axes["M"], axes["N"])):
            assert rows * cols * 2 <= 1 << 30, workload.uuid
    workload = min(
        problem.probes, key=lambda w: math.prod(problem.definition.axis_values(w).values())
    )
    axis_values = problem.definition.axis_values(workload)
    inputs = make_inputs(problem.definition, workload, seed=0, device="cpu")
    outputs = run_reference(problem.definition, inputs, axis_values)
    check_reference_outputs(problem.definition, workload, outputs)
    a = inputs["A"].view(dtype=torch.int16).numpy().view(np.uint16)
    b = inputs["B"].view(dtype=torch.int16).numpy().view(np.uint16)
    c, _ = model_run(a, b, axis_values["M"], axis_values["N"], axis_values["K"])
    reference = outputs["C"].float().numpy()
    err = np.abs(as_f32(c) - reference)
    assert not np.any((err > 1e-2) & (err > 1e-2 * np.abs(reference)))


@pytest.mark.nvcc
def test_kernel_builds_for_sm90a_without_spills(shared_builder: Builder) -> None:
    assert shared_builder.arch == "sm_90"
    result = shared_builder.build(KERNEL.read_text(), "kernel.cu")
    assert result.ok, result.message
    assert result.arch == "sm_90a"  # wgmma: the build stage picks the arch-specific target
    assert result.report is not None and len(result.report.kernels) >= 5
    assert result.report.total_spills == 0


@pytest.mark.nvcc
def test_mma_sync_version_builds_for_sm90_without_spills(device_builder: Builder) -> None:
    """bench/gemm_variants/mma_sync.cu: the earlier tiled path on mma.sync + ldmatrix (never
    run here, so compiled device-only)."""
    result = device_builder.build(MODELLED.read_text(), MODELLED.name)
    assert result.ok, result.message
    assert result.arch == "sm_90"
    assert result.report is not None and result.report.total_spills == 0


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gemm_passes_its_gate_on_every_workload(tmp_path: Path) -> None:
    from klineage.gate.gate import Gate

    problem = load_problem(FOLDER)
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        verdict = gate.run(problem, KernelSource.from_file(problem.kernel_path), time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gemm_without_the_swizzle_passes_its_gate(tmp_path: Path) -> None:
    """The smem_swizzle removal rewrites the tiles as interleaved core matrices and the wgmma
    descriptors to mode 0; the tensor cores must read the same products from it."""
    from klineage.gate.gate import Gate
    from klineage.mechanisms import get
    from klineage.mining.removal import remove_mechanism

    problem = load_problem(FOLDER)
    removal = remove_mechanism(KernelSource.from_file(problem.kernel_path), get("smem_swizzle"))
    assert removal.changed
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        verdict = gate.run(problem, removal.simplified, time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]


@pytest.mark.gpu
@pytest.mark.nvcc
def test_gemm_with_half_the_block_tile_passes_its_gate(tmp_path: Path) -> None:
    """The block_tiling removal narrows the tile to 128 columns and the wgmma to m64n128k16;
    the 64 accumulators a thread keeps must hold the same columns the epilogue writes."""
    from klineage.gate.gate import Gate
    from klineage.mechanisms import get
    from klineage.mining.removal import remove_mechanism

    problem = load_problem(FOLDER)
    removal = remove_mechanism(KernelSource.from_file(problem.kernel_path), get("block_tiling"))
    assert removal.changed and "m64n128k16" in removal.simplified.text
    with Gate(Builder(cache_dir=tmp_path)) as gate:
        verdict = gate.run(problem, removal.simplified, time_it=False)
    assert verdict.passed, [(w.label, w.message) for w in verdict.workloads if not w.passed]
