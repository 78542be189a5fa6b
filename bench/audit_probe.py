"""What the audited gate's tools cost on this GPU: a profiler window around one call, the
persisting-L2 runtime calls, fresh random inputs per call. Prints JSON (design input for
klineage/gate/audit.py)."""

from __future__ import annotations

import json
import statistics
import time

import torch


def _ms(fn, n: int = 20) -> float:
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main() -> None:
    out: dict[str, object] = {"device": torch.cuda.get_device_name(0)}
    x = torch.randn(4096, 1024, device="cuda")
    y = torch.empty_like(x)
    s = torch.cuda.Stream()

    def work() -> None:
        with torch.cuda.stream(s):
            torch.mul(x, 2.0, out=y)
            y.add_(1)

    from torch.profiler import ProfilerActivity, profile

    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    out["profiler_first_ms"] = (time.perf_counter() - t0) * 1e3

    def profiled() -> None:
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            work()
            torch.cuda.synchronize()
        p.profiler.kineto_results.events()

    out["profiler_window_ms"] = _ms(profiled, 10)
    out["plain_call_ms"] = _ms(work)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    events = []
    for e in prof.profiler.kineto_results.events():
        row = {"name": e.name(), "device_type": str(e.device_type())}
        for attr in (
            "device_index",
            "device_resource_id",
            "start_ns",
            "duration_ns",
            "correlation_id",
            "activity_type",
        ):
            try:
                row[attr] = getattr(e, attr)()
            except Exception as err:
                row[attr] = f"n/a: {type(err).__name__}"
        events.append(row)
    out["events"] = events
    out["our_stream"] = s.cuda_stream
    out["event_methods"] = [
        m for m in dir(prof.profiler.kineto_results.events()[0]) if not m.startswith("_")
    ]

    import cupy

    rt = cupy.cuda.runtime
    out["cupy_runtime_has"] = [n for n in dir(rt) if "imit" in n or "ersist" in n or "L2" in n]
    try:
        limit = 0x06  # cudaLimitPersistingL2CacheSize
        out["persisting_limit_before"] = rt.deviceGetLimit(limit)
        rt.deviceSetLimit(limit, 4 * 1024 * 1024)
        out["persisting_limit_set"] = rt.deviceGetLimit(limit)
        out["get_limit_us"] = _ms(lambda: rt.deviceGetLimit(limit), 50) * 1e3
        rt.deviceSetLimit(limit, 0)
        out["set_limit_us"] = _ms(lambda: rt.deviceSetLimit(limit, 0), 50) * 1e3
    except Exception as err:
        out["persisting_error"] = repr(err)
    import ctypes
    import glob
    import os

    libs = sorted(
        glob.glob(
            os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "libcudart.so*"),
            recursive=True,
        )
    )
    out["libcudart"] = [os.path.relpath(p, os.path.dirname(torch.__file__)) for p in libs]
    if libs:
        cudart = ctypes.CDLL(libs[0])
        out["reset_l2_code"] = cudart.cudaCtxResetPersistingL2Cache()
        out["reset_l2_us"] = _ms(lambda: cudart.cudaCtxResetPersistingL2Cache(), 50) * 1e3
    g = torch.Generator(device="cuda").manual_seed(1)
    small = torch.empty(4096, 128, device="cuda")
    big = torch.empty(4096, 4096, device="cuda")
    out["refill_small_us"] = _ms(lambda: small.normal_(generator=g), 50) * 1e3
    out["refill_big_us"] = _ms(lambda: big.normal_(generator=g), 50) * 1e3
    out["randn_new_small_us"] = (
        _ms(lambda: torch.randn(4096, 128, device="cuda", generator=g), 50) * 1e3
    )
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    out["flush_us"] = _ms(lambda: flush.zero_(), 50) * 1e3
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
