"""Shared test set-up: GPU tests skip cleanly on machines without a CUDA GPU."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from klineage.gate.build import Builder

if TYPE_CHECKING:
    from klineage.gate.gate import Gate

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from klineage.gate.sass import find_tool

    has_gpu = _gpu_available()
    has_nvcc = shutil.which("nvcc") is not None
    has_nvdisasm = find_tool("nvdisasm") is not None
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "nvcc" in item.keywords and not has_nvcc:
            item.add_marker(pytest.mark.skip(reason="needs nvcc on PATH"))
        if "nvdisasm" in item.keywords and not has_nvdisasm:
            item.add_marker(
                pytest.mark.skip(reason="needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
            )


@pytest.fixture
def build_cache(tmp_path: Path) -> Path:
    """A private build cache per test, so cache hits are never borrowed from another test."""
    return tmp_path / "build-cache"


def _run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This run's temporary folder: new for every run (so no build is carried over from an
    earlier one) and, under pytest-xdist, the one its workers' folders are made in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def shared_builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """One nvcc builder and cache for the whole run, for tests that need builds to succeed
    rather than to exercise the cache: a source several tests build (an expert kernel, a
    state every mining walk passes through) compiles once, also across pytest-xdist's
    workers (the cache's per-key locks make one wait for the other's compile). Tests of the
    cache use `build_cache`."""
    return Builder(cache_dir=_run_dir(tmp_path_factory) / "shared-builds")


@pytest.fixture(scope="session")
def device_builder(shared_builder: Builder) -> Builder:
    """Device-only builds (`nvcc -cubin`) in the same cache, for tests that ask whether a
    kernel compiles, or for its ptxas report or SASS, and never run or link it: nvcc's front
    end still checks the whole file, host code included, at about half a full build's cost."""
    return Builder(cache_dir=shared_builder.cache_dir, device_only=True)


@pytest.fixture
def shared_cache_dir(shared_builder: Builder, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`KLINEAGE_CACHE_DIR` set to the run's shared cache, for command-line tests whose
    builds must succeed and whose subject is not the cache."""
    monkeypatch.setenv("KLINEAGE_CACHE_DIR", str(shared_builder.cache_dir))
    return shared_builder.cache_dir


@pytest.fixture(scope="module")
def gate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gate]:
    """A gate of its own per module, for the tests that run rewritten kernels (GPU). Here
    rather than in a folder's conftest: pytest did not find a sub-folder's fixture for a file
    when a file of another folder sat between two of that folder's on the command line."""
    from klineage.gate.gate import Gate  # imported by the GPU tests only

    with Gate(Builder(cache_dir=tmp_path_factory.mktemp("cache"))) as judge:
        yield judge
