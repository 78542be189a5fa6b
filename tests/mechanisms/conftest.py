"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder


@pytest.fixture(scope="session")
def mechanism_builder(shared_builder: Builder) -> Builder:
    """The session's nvcc builder, for all mechanism tests: a source shared by two tests (or
    by a mining test) compiles once."""
    return shared_builder
