"""Shared by the smem_staging forward-form tests: the public-form pairs of
``tests/fixtures/public_forms/smem_staging`` and the rule applied or removed at one form."""

from __future__ import annotations

import re

from klineage.kernel import KernelSource
from klineage.mechanisms import Carrier, get
from klineage.mechanisms.base import Site
from tests.mechanisms.roundtrip import PUBLIC_FORMS

staging = get("smem_staging")
FOLDER = PUBLIC_FORMS / "smem_staging"


def staged_pair(case: str) -> tuple[KernelSource, KernelSource]:
    """The expert (before) and its removed state (after) of a fixture pair."""
    return (
        KernelSource.from_file(FOLDER / f"{case}.before.cu"),
        KernelSource.from_file(FOLDER / f"{case}.after.cu"),
    )


def form_candidate(kernel: KernelSource, form: str) -> Site:
    """The one forward candidate of `form` in `kernel`."""
    (site,) = [c for c in staging.candidates(kernel) if c.detail.get("form") == form]
    return site


def apply_form(text: str, form: str) -> str:
    """`text` with the staging of its one `form` candidate applied (the default carrier)."""
    site = form_candidate(KernelSource(text), form)
    assert site.supported, site.refusal
    return staging.apply(KernelSource(text), site, Carrier()).text


def remove_helper_staging(text: str) -> str:
    """`text` with its one removable (helper-staged) staging removed."""
    (site,) = [s for s in staging.detect(KernelSource(text)) if s.supported]
    assert site.detail["form"] == "helper"
    return staging.remove(KernelSource(text), site).text


_THREAD_COUNT = re.compile(r"^  constexpr int THREADS = [^;\n]*;\n", re.MULTILINE)


def counted_at_run_time(text: str) -> str:
    """`text` without its kernel's compile-time name for the block's threads (``constexpr
    int THREADS = ..;``, which the staging removals keep): a forward rule's loader then
    counts the block's threads at run time."""
    found = _THREAD_COUNT.findall(text)
    assert len(found) == 1, found
    return text.replace(found[0], "")
