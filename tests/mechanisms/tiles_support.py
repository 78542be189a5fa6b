"""Checks shared by the tile, pipeline and tensor-core mechanism tests (against the experts).

Each expert folder's ``mechanisms.json`` lists what a reader sees in the kernel. For a
mechanism, :func:`expert_listings` gives the (kernel, entry) pairs that name it;
:func:`check_expert_detection` asserts ``detect`` finds a site overlapping each entry's
lines, and :func:`expert_removals` removes every supported detected site of those kernels
(one at a time, from the original) so a test can compile them all in one ``build_many``.
"""

from __future__ import annotations

import json
from pathlib import Path

from klineage.gate.build import Builder
from klineage.kernel import KernelSource
from klineage.mechanisms import Mechanism, get
from tests.conftest import REPO

EXPERTS = REPO / "expert_kernels"


def expert_listings(mechanism: str) -> list[tuple[Path, dict[str, object]]]:
    """(kernel.cu, entry) for every expert entry that names ``mechanism``."""
    found = []
    for listed in sorted(EXPERTS.glob("*/mechanisms.json")):
        for entry in json.loads(listed.read_text(encoding="utf-8")):
            if entry.get("mechanism") == mechanism:
                found.append((listed.parent / "kernel.cu", entry))
    return found


def check_expert_detection(mechanism: str) -> int:
    """Assert every listing of ``mechanism`` is detected where it says; return how many."""
    subject = get(mechanism)
    listings = expert_listings(mechanism)
    for path, entry in listings:
        sites = subject.detect(KernelSource.from_file(path))
        first, last = entry["lines"]  # type: ignore[misc]
        hits = [s for s in sites if s.overlaps_lines(first, last)]
        assert hits, (
            f"{mechanism} not found at {path.parent.name}:{first}-{last}; detected: "
            + "; ".join(str(s) for s in sites)
        )
    return len(listings)


def expert_removals(mechanism: str) -> list[KernelSource]:
    """The kernels listing ``mechanism`` with each supported site removed in turn."""
    subject: Mechanism = get(mechanism)
    results = []
    for path in sorted({p for p, _ in expert_listings(mechanism)}):
        kernel = KernelSource.from_file(path)
        for site in subject.detect(kernel):
            if site.supported:
                removed = subject.remove(kernel, site)
                assert removed.text != kernel.text
                results.append(
                    KernelSource(removed.text, name=f"{path.parent.name}-{site.lines}.cu")
                )
    return results


TILE_MECHANISMS = (
    "smem_padding",
    "smem_swizzle",
    "smem_staging",
    "cp_async_pipeline",
    "tensor_core_mma",
    "ldmatrix",
    "block_tiling",
    "warp_tiling",
    "rasterization",
    "split_k",
    "launch_size_dispatch",
)
_BUILT: dict[tuple[int, str], list[tuple[str, bool, str]]] = {}


def expert_removal_builds(builder: Builder, mechanism: str) -> list[tuple[str, bool, str]]:
    """(kernel name, compiled, message) of every expert removal of ``mechanism``.

    The first call compiles the removals of all the tile mechanisms in one ``build_many``
    (two nvcc processes at a time, equal sources once); later calls read the results.
    """
    key = (id(builder), mechanism)
    if key not in _BUILT:
        kernels = {name: expert_removals(name) for name in TILE_MECHANISMS}
        unique = {k.text: k for found in kernels.values() for k in found}
        results = builder.build_many([(k.text, k.name) for k in unique.values()])
        by_text = dict(zip(unique, results, strict=True))
        for name, found in kernels.items():
            _BUILT[(id(builder), name)] = [
                (k.name, by_text[k.text].ok, by_text[k.text].message) for k in found
            ]
    return _BUILT[key]


def check_expert_removals_compile(
    builder: Builder, mechanism: str, *, expect_some: bool = True
) -> None:
    """Assert every expert removal of ``mechanism`` compiles (and that there is one, unless
    every expert site is refused)."""
    built = expert_removal_builds(builder, mechanism)
    assert bool(built) == expect_some, f"{len(built)} expert removals of {mechanism}"
    for name, ok, message in built:
        assert ok, f"{mechanism}: {name} does not compile:\n{message}"
