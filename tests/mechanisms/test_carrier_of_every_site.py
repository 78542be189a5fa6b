"""Mining asks ``carrier_of`` of every site it removes (the carrier goes on the lineage edge),
so a site a mechanism can remove must also have a carrier. A public expert's ``cg::reduce``
site once removed fine and then stopped mining with an uncaught refusal from ``carrier_of``."""

from __future__ import annotations

from pathlib import Path

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, MechanismRefused, all_mechanisms
from tests.mechanisms.test_public_reductions import CG_ROWS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SOURCES = sorted(
    p for root in ("mechanisms", "public_forms") for p in (FIXTURES / root).rglob("*.cu")
)


def _removable_sites(kernel: KernelSource):  # type: ignore[no-untyped-def]
    for mechanism in all_mechanisms():
        for site in mechanism.detect(kernel):
            if not site.supported:
                continue
            try:
                mechanism.remove(kernel, site)
            except MechanismRefused:
                continue
            yield mechanism, site


def test_cg_reduce_site_has_a_carrier() -> None:
    kernel = KernelSource(CG_ROWS)
    found = [(m, s) for m, s in _removable_sites(kernel) if s.detail.get("kind") == "cg_reduce"]
    assert found, "the cg::reduce sites are removable"
    for mechanism, site in found:
        assert mechanism.carrier_of(kernel, site) == Carrier()


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_every_removable_site_has_a_carrier(path: Path) -> None:
    kernel = KernelSource(path.read_text())
    for mechanism, site in _removable_sites(kernel):
        carrier = mechanism.carrier_of(kernel, site)
        assert isinstance(carrier, Carrier), f"{mechanism.name} at {site}"
