"""The rotation swizzle written back where its removal left shared rows unrotated (cp.async
stores and ldmatrix loads whose column wraps at the row, cuda_hgemm's idiom): the candidate
sits where the removal happened, applying writes the rotation at every access, exactly as the
pair ``public_forms/smem_swizzle/rotation_ldmatrix`` spells it, and every ldmatrix lane reads
the chunk its writer wrote, with an ldmatrix phase's eight rows in eight bank groups."""

from __future__ import annotations

import re

import pytest

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, get
from klineage.mechanisms._swizzle_rotation import RowAccess, common_rotation, row_array
from klineage.mechanisms.base import Site
from klineage.mining.removal import matching_candidate, reapply, remove_mechanism
from tests.mechanisms.roundtrip import PUBLIC_FORMS, compile_ok, diff

swizzle = get("smem_swizzle")
PAIR = PUBLIC_FORMS / "smem_swizzle"
BEFORE = (PAIR / "rotation_ldmatrix.before.cu").read_text(encoding="utf-8")
AFTER = (PAIR / "rotation_ldmatrix.after.cu").read_text(encoding="utf-8")
SPELLED_BEFORE = (PAIR / "rotation.before.cu").read_text(encoding="utf-8")
SPELLED_AFTER = (PAIR / "rotation.after.cu").read_text(encoding="utf-8")
"""A rotation spelled through macros and the lane (not the form the rule writes)."""

LOAD_COLUMN = "(k * FRAG + (lane / 16) * 8) % TILE_COLS"
STORE_COLUMN = "((lane % ROW_LANES) % ROW_LANES) * CHUNK_BYTES"


def _candidate(text: str) -> Site:
    (site,) = [c for c in swizzle.candidates(KernelSource(text)) if c.detail.get("form")]
    return site


def _apply(text: str, carrier: Carrier | None = None) -> str:
    return swizzle.apply(KernelSource(text), _candidate(text), carrier or Carrier()).text


def _remove(text: str) -> str:
    return remove_mechanism(KernelSource(text), swizzle).simplified.text


def test_the_removed_state_offers_the_array_where_the_removal_happened() -> None:
    site = matching_candidate(swizzle, KernelSource(BEFORE), KernelSource(AFTER))
    assert site is not None and site.supported, site and site.refusal
    assert site.detail == {"kernel": "fragment_copy", "form": "rotation", "array": "tile"}
    assert site.snippet == "tile: 2 accesses with unrotated rows"
    assert (site.start_line, site.end_line) == (27, 41)


def test_the_forward_rule_writes_the_removed_rotation_back_exactly() -> None:
    removal = remove_mechanism(KernelSource(BEFORE), swizzle)
    assert removal.simplified.text == AFTER
    assert removal.carriers == [Carrier(shift_rows=2)]
    again = reapply(removal)
    assert again.text == BEFORE, diff(again.text, BEFORE)
    (site,) = swizzle.detect(again)
    assert site.supported and site.detail["form"] == "rotation"


def test_a_rotation_spelled_otherwise_comes_back_as_the_same_permutation() -> None:
    removal = remove_mechanism(KernelSource(SPELLED_BEFORE), swizzle)
    assert removal.simplified.text == SPELLED_AFTER
    again = reapply(removal).text
    assert "[(column + ((group * GROUP_ROWS + lane % GROUP_ROWS) % 8) / 2) % ROW_CHUNKS]" in again
    assert "tile[row][(lane % ROW_CHUNKS + (row % 8) / 2) % ROW_CHUNKS] =" in again
    assert _remove(again) == SPELLED_AFTER

    def rotation(text: str) -> tuple[tuple[int, ...], int]:
        kernel = KernelSource(text)
        (site,) = swizzle.detect(kernel)
        statement = swizzle.node_at(kernel.parsed, site)
        function = kernel.parsed.enclosing_function(statement)
        assert function is not None
        return common_rotation(kernel.parsed, function, statement)

    assert rotation(again) == rotation(SPELLED_BEFORE) == ((0, 0, 16, 16, 32, 32, 48, 48), 64)


def test_one_chunk_a_row_when_the_carrier_says_so() -> None:
    applied = _apply(AFTER, Carrier(shift_rows=1))
    assert "((lane % ROW_LANES + row % 4) % ROW_LANES) * CHUNK_BYTES" in applied
    assert "(k * FRAG + (lane / 16) * 8 + (frag_row + lane % 16) % 4 * 8) % TILE_COLS" in applied
    assert _remove(applied) == AFTER


def test_without_a_carrier_the_rows_of_one_bank_line_share_a_rotation() -> None:
    assert _apply(AFTER) == BEFORE  # 64-byte rows: two to a 128-byte line


# -- exactness: each ldmatrix lane reads the chunk its writer wrote -------------------------

THREADS, WARPS, LANES = 128, 4, 32
ROW_BYTES, CHUNK_BYTES, BANK_LINE = 64, 16, 128


def _defines(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^#define (\w+) (\d+)", text, flags=re.MULTILINE)}


def _value(text: str, names: dict[str, int]) -> int:
    """A C integer expression of non-negative values (``/`` truncates)."""
    python = re.sub(r"(?<!/)/(?!/)", "//", " ".join(text.split()).replace("threadIdx.x", "tx"))
    return int(eval(python, {"__builtins__": {}}, dict(names)))  # our own fixture text


def _slot(text: str, access: RowAccess, names: dict[str, int]) -> tuple[int, int]:
    """(row, chunk) an access touches, from its row and wrapped column."""
    kernel = KernelSource(text).parsed
    row = _value(kernel.text_of(access.row), names)
    column = _value(kernel.text_of(access.column.total), names) % access.column.modulus
    return row, column * access.column.unit // CHUNK_BYTES


def _accesses(text: str) -> tuple[RowAccess, RowAccess]:
    kernel = KernelSource(text).parsed
    (function,) = kernel.kernels
    store, load = row_array(kernel, function, "tile", "").accesses
    return store, load


def _written(text: str) -> dict[tuple[int, int], tuple[int, int]]:
    """The slot each (row, chunk of x) lands in."""
    store, _ = _accesses(text)
    written = {}
    for tx in range(THREADS):
        for copy in range(2):  # TILE_ROWS / COPY_ROWS passes
            names = {**_defines(text), "tx": tx, "lane": tx % LANES, "pass": copy}
            names["row"] = copy * 32 + tx // 4
            written[(names["row"], tx % 4)] = _slot(text, store, names)
    return written


def _read(text: str) -> dict[tuple[int, int, int], tuple[int, int]]:
    """The slot each (warp, fragment column k, lane) reads with ldmatrix."""
    _, load = _accesses(text)
    read = {}
    for warp in range(WARPS):
        for k in range(2):  # TILE_COLS / FRAG fragment tiles
            for lane in range(LANES):
                names = {**_defines(text), "lane": lane, "k": k, "frag_row": warp * 16}
                read[(warp, k, lane)] = _slot(text, load, names)
    return read


@pytest.mark.parametrize("text", [BEFORE, AFTER, _apply(AFTER, Carrier(shift_rows=1))])
def test_every_ldmatrix_lane_reads_the_chunk_its_writer_wrote(text: str) -> None:
    written, read = _written(text), _read(text)
    assert len(set(written.values())) == len(written) == 64 * 4  # a bijection onto the tile
    for (warp, k, lane), slot in read.items():
        # lane l points at row l % 16 of the warp's 16 rows, halves (l / 16) * 8 of tile k
        wanted = (warp * 16 + lane % 16, (k * 16 + lane // 16 * 8) // 8)
        assert slot == written[wanted], (warp, k, lane)


def _phase_bank_groups(text: str) -> set[int]:
    """How many 16-byte bank groups each ldmatrix phase (8 lanes, 8 rows) meets."""
    groups = set()
    for (_, _, lane), (row, chunk) in sorted(_read(text).items()):
        if lane % 8 == 0:
            phase: list[int] = []
        phase.append((row * ROW_BYTES + chunk * CHUNK_BYTES) % BANK_LINE // CHUNK_BYTES)
        if lane % 8 == 7:
            groups.add(len(set(phase)))
    return groups


def test_the_rotation_spreads_each_ldmatrix_phase_over_every_bank() -> None:
    assert _phase_bank_groups(BEFORE) == {8}
    assert _phase_bank_groups(AFTER) == {2}  # four rows a bank group: four-way conflicts


# -- forms the rule does not take -------------------------------------------------------------


def _refused(text: str) -> str:
    site = _candidate(text)
    assert site.refusal is not None
    with pytest.raises(MechanismRefused, match="this rule needs a 2-D shared array"):
        swizzle.apply(KernelSource(text), site, Carrier())
    return site.refusal


def test_a_column_not_wrapped_at_the_row_is_refused_with_its_line() -> None:
    text = AFTER.replace(LOAD_COLUMN, "k * FRAG + (lane / 16) * 8")
    assert "an access at line 41" in _refused(text) and "has no column `(...) % C`" in (
        _refused(text)
    )


def test_a_pointer_made_from_the_array_in_the_same_phase_is_refused() -> None:
    flat = "  const half* flat = &tile[0][0];\n  y[threadIdx.x] = flat[threadIdx.x];\n"
    text = AFTER.replace("  __syncthreads();\n", flat + "  __syncthreads();\n")
    assert "a pointer made from the array" in _refused(text)


def test_a_row_subscript_with_side_effects_is_refused() -> None:
    text = AFTER.replace("&tile[row][0]", "&tile[row++][0]").replace("const int row =", "int row =")
    assert "whose row subscript writes or calls something" in _refused(text)


def test_rows_of_one_chunk_are_refused() -> None:
    text = AFTER.replace("#define TILE_COLS 32", "#define TILE_COLS 8").replace(
        "#define ROW_LANES 4", "#define ROW_LANES 1"
    )
    assert "whose rows of 16 bytes are not two chunks or more" in _refused(text)


def test_rotated_rows_are_no_candidate() -> None:
    assert not [c for c in swizzle.candidates(KernelSource(BEFORE)) if c.detail.get("form")]


def test_a_row_count_below_one_is_refused() -> None:
    with pytest.raises(MechanismRefused, match="shift_rows=0 is not a positive row count"):
        _apply(AFTER, Carrier(shift_rows=0))


@pytest.mark.nvcc
def test_the_applied_states_compile(mechanism_builder: Builder) -> None:
    applied = [
        _apply(AFTER),
        _apply(AFTER, Carrier(shift_rows=1)),
        reapply(remove_mechanism(KernelSource(SPELLED_BEFORE), swizzle)).text,
    ]
    compile_ok(mechanism_builder, [KernelSource(text) for text in applied])
