"""The profiler window on the GPU: it sees work a call leaves on another stream, and nothing on
honest calls or on work joined back to the caller's stream."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def watcher():  # type: ignore[no-untyped-def]
    from klineage.gate.watch import LaunchWatcher

    made = LaunchWatcher()
    assert made.available, made.reason
    return made


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
