"""A swizzle written as a rotation of the 16-byte chunks of each shared row, inline at every
access (cuda_hgemm's idiom): removed when every access rotates the same way, refused naming the
access otherwise; the before/after pair is ``public_forms/smem_swizzle/rotation``."""

from __future__ import annotations

import re

import pytest

from klineage.cuda.source import Node, ParsedSource
from klineage.kernel import KernelSource
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import PUBLIC_FORMS

swizzle = get("smem_swizzle")
PAIR = PUBLIC_FORMS / "smem_swizzle"
BEFORE = (PAIR / "rotation.before.cu").read_text(encoding="utf-8")
AFTER = (PAIR / "rotation.after.cu").read_text(encoding="utf-8")

READ_ROTATION = "(column + (lane % GROUP_ROWS) / ROT_ROWS) % ROW_CHUNKS"
STORE_ROTATION = "(lane % ROW_CHUNKS + (row % (ROW_CHUNKS * ROT_ROWS)) / ROT_ROWS)"


def _site(text: str):
    (site,) = swizzle.detect(KernelSource(text))
    return site


def _changed(old: str, new: str, count: int = 1) -> str:
    assert BEFORE.count(old) >= count, old
    return BEFORE.replace(old, new, count)


def test_a_rotation_at_every_access_is_a_supported_site() -> None:
    site = _site(BEFORE)
    assert site.supported and site.detail["form"] == "rotation"
    (condition,) = swizzle.conditions(KernelSource(BEFORE), site)
    assert "the same row-dependent amount" in str(condition.text)


def test_an_access_without_the_rotation_is_refused_with_its_line() -> None:
    site = _site(_changed(READ_ROTATION, "column % ROW_CHUNKS"))
    assert not site.supported
    assert "an access at line 47" in str(site.refusal)
    assert "has no term that depends on the row alone" in str(site.refusal)


def test_two_different_rotations_are_refused() -> None:
    # row % 8 chunks at the reads, (row % 8) / 2 at the stores
    site = _site(_changed(READ_ROTATION, "(column + lane % GROUP_ROWS) % ROW_CHUNKS"))
    assert not site.supported
    assert "rotated one way at line 29 and another at line 47" in str(site.refusal)


def test_a_rotation_that_depends_on_the_chunk_is_refused() -> None:
    chunk_too = "(lane % ROW_CHUNKS + (lane + row % 8) / ROT_ROWS)"
    site = _site(_changed(STORE_ROTATION, chunk_too))
    assert not site.supported
    assert "an access at line 29" in str(site.refusal)


def test_a_pointer_made_from_the_array_used_in_the_same_phase_is_refused() -> None:
    flat = "  const float* flat = &tile[0][0].x;\n  y[threadIdx.x] = flat[threadIdx.x];\n"
    site = _site(_changed("  __syncthreads();\n", flat + "  __syncthreads();\n"))
    assert not site.supported
    assert "a pointer made from the array" in str(site.refusal)


def test_an_array_declared_at_file_scope_is_refused() -> None:
    # other functions could access it, and only the kernel is read
    declaration = "  __shared__ float4 tile[TILE_ROWS][ROW_CHUNKS];\n"
    moved = _changed(declaration, "").replace("__global__", declaration.strip() + "\n__global__")
    sites = swizzle.detect(KernelSource(moved))
    assert sites and not any(site.supported for site in sites)


# -- exactness: every reader reads the slot its writer wrote, before and after ---------------

THREADS = 128  # TILE_ROWS * ROW_CHUNKS
CHUNK_BYTES = 16


def _c_value(text: str, names: dict[str, int]) -> int:
    """A C integer expression of non-negative values (``/`` truncates)."""
    flat = " ".join(text.split()).replace("threadIdx.x", "tx")
    python = re.sub(r"(?<!/)/(?!/)", "//", flat)
    return int(eval(python, {"__builtins__": {}}, dict(names)))  # our own fixture text


def _locals(source: ParsedSource, tx: int) -> dict[str, int]:
    """The macros and the kernel's ``int`` locals of thread ``tx``."""
    defines = re.findall(r"^#define (\w+) (\d+)", source.kernel.text, flags=re.MULTILINE)
    names: dict[str, int] = {**{k: int(v) for k, v in defines}, "tx": tx}
    for declarator in source.nodes("init_declarator"):
        declaration = declarator.parent
        value = declarator.child_by_field_name("value")
        if declaration is None or value is None or "int " not in source.text_of(declaration):
            continue
        name = declarator.child_by_field_name("declarator")
        assert name is not None
        names[source.text_of(name)] = _c_value(source.text_of(value), names)
    return names


def _index(source: ParsedSource, access: Node) -> tuple[Node, Node]:
    outer = access.child_by_field_name("indices")
    inner = access.child_by_field_name("argument")
    assert outer is not None and inner is not None
    row = inner.child_by_field_name("indices")
    assert row is not None
    return row.named_children[0], outer.named_children[0]


def _slots(text: str) -> tuple[list[list[tuple[int, int]]], list[tuple[int, int]]]:
    """Per thread: the (row, chunk) slots its stores write, and the slot it reads."""
    source = KernelSource(text).parsed
    accesses = [
        n
        for n in source.nodes("subscript_expression")
        if source.text_of(n).startswith("tile[")
        and n.parent is not None
        and n.parent.type != "subscript_expression"
    ]
    stores: list[list[tuple[int, int]]] = [[] for _ in range(THREADS)]
    reads: list[tuple[int, int]] = []
    for tx in range(THREADS):
        names = _locals(source, tx)
        for access in accesses:
            row, column = (_c_value(source.text_of(n), names) for n in _index(source, access))
            address = access.parent
            if address is not None and address.type == "pointer_expression":  # cvta(&S[r][0]) + b
                call = address.parent.parent  # type: ignore[union-attr]
                offset = call.parent.child_by_field_name("right")
                stores[tx].append((row, _c_value(source.text_of(offset), names) // CHUNK_BYTES))
            elif address is not None and address.type == "assignment_expression":
                stores[tx].append((row, column))
            else:
                reads.append((row, column))
    return stores, reads


@pytest.mark.parametrize("text", [BEFORE, AFTER], ids=["before", "after"])
def test_every_reader_reads_the_slot_its_writer_wrote(text: str) -> None:
    stores, reads = _slots(text)
    # both stores of a thread (cp.async, or zeros past the edge) hit one slot
    written = [set(slots) for slots in stores]
    assert all(len(slots) == 1 for slots in written)
    assert len({next(iter(s)) for s in written}) == THREADS  # a bijection onto the tile
    for tx, slot in enumerate(reads):
        lane, column = tx % 32, tx // 32
        # the thread that loaded row `lane`, chunk `column`: warp lane / 8, lane (lane % 8) * 4 + c
        writer = lane // 8 * 32 + lane % 8 * 4 + column
        assert slot in written[writer], (tx, slot, written[writer])


def test_the_removal_changes_the_layout() -> None:
    assert _slots(BEFORE)[1] != _slots(AFTER)[1]
