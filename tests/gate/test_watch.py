"""The profiler window's set-up, on the CPU (the window itself runs in the GPU tests)."""

from __future__ import annotations

import torch

from klineage.gate.watch import _KinetoWindow


def test_the_lean_profiler_window_is_available_on_this_torch() -> None:
    # without it the worker falls back to torch.profiler, twice as slow per window: a torch
    # upgrade that drops the private calls must show here, not as a slower gate
    window = _KinetoWindow.make()
    assert window is not None
    assert torch.autograd.ProfilerActivity.CUDA in window._activities
