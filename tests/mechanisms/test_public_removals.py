"""Removals of the forms public experts write, checked on before/after fixtures in their
idioms (``tests/fixtures/public_forms/<mechanism>/``): removing every removable site gives
``after`` exactly, leaves no removable site, and both states compile.

These forms mostly have no forward rule (vectors staged once do: test_staging_row_vectors.py
walks those smem_staging pairs forward): their skills are mined (removal, gate) but are not
transferable, so the round-trip suite (which re-applies) does not cover them. The exceptions
are warp_shuffle_reduction, whose removals write its own exchange form (the tests of that
mechanism walk its ``online_pairs`` and ``quad_columns`` pairs forward again), warp_tiling,
whose removal writes the grid its application reads (tests/mechanisms/test_warp_tiling.py),
grid_stride_loop's ``rows_by_z`` and ``row_turns``, whose one index per thread along any grid
dimension is written back into the loop (tests/mechanisms/test_grid_stride_loop.py),
thread_coarsening's ``loads_per_turn``, whose grid-stride loop of one load a turn takes
several again (tests/mechanisms/test_coarsening_loads_forward.py), smem_staging's tiles a
helper stages in a 1-D layout, whose removed tile loops its ``tile_loop`` form stages again
(tests/mechanisms/test_staging_helper_forward.py) or in 2-D bounds-checked tiles, staged again
by its ``tile_loop_2d`` form (tests/mechanisms/test_staging_tile_2d_forward.py) or, where
the loader's tiles fed register micro-tiles (``vector_tiles``, ``vector_pairs``), by its
``operand_tiles`` form (tests/mechanisms/test_staging_operands_forward.py), and
warp_per_row's ``rows_2d`` and ``rows_2d_walk_back``, whose thread per row in a 32 x y block is
written back into a warp per row (tests/mechanisms/test_warp_rows_2d_forward.py), and
smem_swizzle's ``rotation`` pairs, whose unrotated shared rows get a rotation of their chunks
written back at every access (tests/mechanisms/test_swizzle_rotation_forward.py), and
cp_async_pipeline's ``ring_stages``, whose one-stage mbarrier ring gets its stages back
(tests/mechanisms/test_cp_async_pipeline.py), block_tiling's ``wide_template``, whose
template wgmma tile is widened back (tests/mechanisms/test_block_tiling.py), and
vectorized_access's ``address_macros``, whose split accesses merge back into the file's access
macro (tests/mechanisms/test_vectorized_access.py).
"""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder
from klineage.mechanisms import get
from tests.mechanisms.roundtrip import (
    PUBLIC_FORMS,
    Pair,
    compile_ok,
    diff,
    fixture_pairs,
    removal_chain,
)

PAIRS = [
    pair
    for folder in sorted(PUBLIC_FORMS.iterdir())
    if any(folder.glob("*before.cu"))  # problems/ holds the pairs' problem files
    for pair in fixture_pairs(folder.name, PUBLIC_FORMS)
]


def _id(pair: Pair) -> str:
    return f"{pair.mechanism}-{pair.case}"


@pytest.mark.parametrize("pair", PAIRS, ids=_id)
def test_removing_every_site_gives_the_after_fixture(pair: Pair) -> None:
    mechanism = get(pair.mechanism)
    chain = removal_chain(mechanism, pair.before)
    assert chain.sites, f"{pair.mechanism}: no removable site in {pair.case}"
    got = chain.states[-1].text
    assert got == pair.after.text, diff(got, pair.after.text)
    assert not [s for s in mechanism.detect(pair.after) if s.supported]


@pytest.mark.nvcc
def test_both_states_of_every_pair_compile(mechanism_builder: Builder) -> None:
    compile_ok(mechanism_builder, [k for pair in PAIRS for k in (pair.before, pair.after)])
