"""Fixtures shared by the mechanism tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from klineage.gate.build import Builder

if TYPE_CHECKING:
    from klineage.gate.gate import Gate


@pytest.fixture(scope="session")
def mechanism_builder(device_builder: Builder) -> Builder:
    """The session's device-only nvcc builder, for all mechanism tests: they ask whether a
    rewrite compiles (front end over the whole file, ptxas), never run it, so the host
    compiler and the link are left out; a source shared by two tests compiles once."""
    return device_builder


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """A gate of its own per module, for the tests that run rewritten kernels (GPU)."""
    from klineage.gate.gate import Gate  # imported by the GPU tests only

    with Gate(Builder(cache_dir=tmp_path_factory.mktemp("cache"))) as judge:
        yield judge
