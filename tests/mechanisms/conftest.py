"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

import pytest

from klineage.gate.build import Builder


@pytest.fixture(scope="session")
def mechanism_builder(device_builder: Builder) -> Builder:
    """The session's device-only nvcc builder, for all mechanism tests: they ask whether a
    rewrite compiles (front end over the whole file, ptxas), never run it, so the host
    compiler and the link are left out; a source shared by two tests compiles once."""
    return device_builder
