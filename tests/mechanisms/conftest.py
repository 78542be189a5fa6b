"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder


@pytest.fixture(scope="session")
def mechanism_builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """One nvcc builder with a private cache for all mechanism tests of the session, so a
    source shared by two tests compiles once."""
    return Builder(cache_dir=tmp_path_factory.mktemp("mechanism-builds"), arch="sm_90")
