"""bench/public_walk_reach.py: the rounds of removals a walk can make without a GPU."""

from __future__ import annotations

from klineage.kernel import KernelSource
from klineage.mechanisms import detect_all
from tests.bench_scripts import load_bench_script
from tests.conftest import FIXTURES

reach = load_bench_script("public_walk_reach")


def test_a_walk_takes_the_cache_then_the_warp_rows_it_kept() -> None:
    # warp_per_row is refused while the row cache indexes shared memory by threadIdx.y; once a
    # round removes the cache, a later round removes the warp rows
    kernel = KernelSource.from_file(
        FIXTURES / "public_forms" / "smem_staging" / "row_cache.before.cu"
    )
    final, removed = reach.walk(kernel)
    assert removed.index("smem_staging") < removed.index("warp_per_row")
    assert "warp_shuffle_reduction" in removed
    left = {site.mechanism for site in detect_all(final) if site.supported}
    assert left == set()  # nothing a further round could take
