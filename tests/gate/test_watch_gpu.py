"""The profiler window on the GPU: it sees work a call leaves on another stream, and nothing on
honest calls; with KLINEAGE_PROFILER_MARKER=flag, the same through the flag marker (ends once
run() has returned)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def watcher():  # type: ignore[no-untyped-def]
    from klineage.gate.watch import LaunchWatcher

    made = LaunchWatcher()
    assert made.available, made.reason
    return made


def test_the_flag_marker_is_used_where_asked_for_and_cupy_is_installed(watcher) -> None:  # type: ignore[no-untyped-def]
    from klineage.gate.watch import MARKER_ENV

    if os.environ.get(MARKER_ENV) != "flag":
        assert watcher.opening_marker == "fixed"
        return
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed: the fixed marker is used")
    assert watcher.opening_marker == "flag", watcher.fixed_marker_reason


def test_work_on_the_given_stream_is_the_calls_own(watcher) -> None:  # type: ignore[no-untyped-def]
    import torch

    x = torch.ones(1 << 20, device="cuda")
    seen = watcher.watch(lambda: x.mul_(2))
    assert seen.names and not seen.outside
    torch.cuda.synchronize()
    assert float(x[0]) == 2.0


def test_work_left_on_another_stream_is_outside(watcher) -> None:  # type: ignore[no-untyped-def]
    import torch

    x = torch.ones(1 << 22, device="cuda")
    side = torch.cuda.Stream()

    def call() -> None:
        with torch.cuda.stream(side):  # not joined to the caller's stream
            for _ in range(4):
                x.mul_(1.0001)

    seen = watcher.watch(call)
    assert seen.outside, seen.names


def test_work_joined_back_through_an_event_is_the_calls_own(watcher) -> None:  # type: ignore[no-untyped-def]
    import torch

    x = torch.ones(1 << 20, device="cuda")
    side = torch.cuda.Stream()

    def call() -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            x.mul_(3)
        main.wait_stream(side)

    seen = watcher.watch(call)
    assert seen.names and not seen.outside
