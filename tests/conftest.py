"""Shared test set-up: GPU tests skip cleanly on machines without a CUDA GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from klineage.gate.build import Builder

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


@pytest.fixture(scope="session")
def shared_builder(tmp_path_factory: pytest.TempPathFactory) -> Builder:
    """One nvcc builder and cache for the whole run, for tests that need builds to succeed
    rather than to exercise the cache: a source several tests build (an expert kernel, a
    state every mining walk passes through) compiles once. Tests of the cache use
    `build_cache`."""
    return Builder(cache_dir=tmp_path_factory.mktemp("shared-builds"))
