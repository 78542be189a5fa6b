"""Removing a row each thread caches in shared memory (llm.c layernorm k6's idiom): the store
goes, reads load global memory again; the refusals name what breaks the form."""

from __future__ import annotations

import pytest

from klineage.kernel import KernelSource
from klineage.mechanisms import MechanismRefused, get
from klineage.mechanisms.base import Site
from tests.mechanisms.roundtrip import PUBLIC_FORMS

staging = get("smem_staging")
warp_rows = get("warp_per_row")
TEXT = (PUBLIC_FORMS / "smem_staging" / "row_cache.before.cu").read_text()
STORE = "    cached[c / 4] = chunk;\n"
READ = "    const float4 chunk = cached[c / 4];\n"


def _site(text: str) -> Site:
    (site,) = staging.detect(KernelSource(text))
    return site


def _refusal(text: str) -> str:
    site = _site(text)
    assert site.refusal is not None and "as a cached row" in site.refusal
    with pytest.raises(MechanismRefused):
        staging.remove(KernelSource(text), site)
    return site.refusal


def test_the_cache_goes_and_reads_load_the_row_again() -> None:
    site = _site(TEXT)
    assert site.supported and site.detail["form"] == "row_cache"
    removed = staging.remove(KernelSource(TEXT), site).text
    assert STORE not in removed and "__shared__" not in removed
    assert removed.count("const float4 chunk = *reinterpret_cast<const float4*>(x + c);") == 2


def test_with_the_cache_gone_the_warp_rows_become_thread_rows() -> None:
    # the chain llm.c layernorm k6 needs: its row cache kept warp_per_row refused
    assert not warp_rows.detect(KernelSource(TEXT))[0].supported
    removed = staging.remove(KernelSource(TEXT), _site(TEXT))
    (site,) = warp_rows.detect(removed)
    assert site.supported, site.refusal
    rows = warp_rows.remove(removed, site).text
    assert "for (int c = 0; c < cols; c += 4) {" in rows
    assert "const float mean = sum / cols;" in rows


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ((READ, "    const float4 chunk = cached[c / 4 + 1];\n"), "of another slot"),
        (
            (
                "  const float mean = warp_total(sum) / cols;\n",
                "  const float mean = warp_total(sum) / cols;\n  x += cols;\n",
            ),
            "a load over x, written while the cache lives",
        ),
        (
            ("c = threadIdx.x * 4;", "c = threadIdx.x * 2;"),
            "not a multiple of it",
        ),
    ],
)
def test_a_cache_out_of_form_is_refused_with_the_reason(
    change: tuple[str, str], refusal: str
) -> None:
    text = TEXT.replace(*change)
    assert text != TEXT
    assert refusal in _refusal(text)


def test_a_slice_read_by_another_walk_is_no_row_cache() -> None:
    # a later loop over other slots (a tile for the block) is not a thread reading its own
    text = TEXT.replace(
        "  const float mean = warp_total(sum) / cols;\n  for (int c = threadIdx.x * 4;",
        "  const float mean = warp_total(sum) / cols;\n  for (int c = threadIdx.x * 8;",
    )
    assert text != TEXT
    assert staging.detect(KernelSource(text)) == []


def test_a_reduction_that_also_scales_combines_the_partial() -> None:
    # `v = reduce(v) / n` sets v as the reduction does: its own target is no early read
    text = (PUBLIC_FORMS / "warp_per_row" / "rows_2d.before.cu").read_text()
    scaled = text.replace(
        "  sum = warp_total(sum);\n  const float mean = sum / cols;\n",
        "  sum = warp_total(sum) / cols;\n  const float mean = sum;\n",
    )
    assert scaled != text
    (site,) = warp_rows.detect(KernelSource(scaled))
    assert site.supported, site.refusal
    assert "  sum = sum / cols;\n" in warp_rows.remove(KernelSource(scaled), site).text
