"""bench/public_walk_reach.py: the removals a walk can make without a GPU, in mining's order."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES

reach = load_bench_script("public_walk_reach")


def test_a_walk_takes_the_cache_then_the_warp_rows_it_kept() -> None:
    # warp_per_row is refused while the row cache indexes shared memory by threadIdx.y; once a
    # step removes the cache, a later step removes the warp rows
    kernel = KernelSource.from_file(
        FIXTURES / "public_forms" / "smem_staging" / "row_cache.before.cu"
    )
    final, removed = reach.walk(kernel)
    assert removed.index("smem_staging") < removed.index("warp_per_row")
    assert "warp_shuffle_reduction" in removed
    left = {site.mechanism for site in detect_all(final) if site.supported}
    assert left == set()  # nothing a further step could take


def test_a_removal_that_strands_another_goes_after_it() -> None:
    # removing the turns first would leave the split choice with only refused sites (the kernel
    # then follows the host's count), so the walk takes the split first, as mining does
    kernel = KernelSource.from_file(
        FIXTURES / "public_forms" / "grid_stride_loop" / "row_turns.before.cu"
    )
    removable = {s.mechanism for s in detect_all(kernel) if s.supported}
    assert {"grid_stride_loop", "split_k"} <= removable
    _, removed = reach.walk(kernel)
    assert removed.index("split_k") < removed.index("grid_stride_loop")
