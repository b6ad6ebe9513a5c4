"""The one CUDA timing helper, and provenance, for the kernel, engine and calibration benchmarks.

event_times(fn, reps, warmup=1, per_call=1) -> [ms]: CUDA events between back-to-back calls of `fn`
    on the current stream (no host sync between them; one at the end), after `warmup` calls;
    each interval divided by `per_call` (e.g. steps per graph replay).
capture_graph(body, warm) -> CUDAGraph of `body`, after one warm-up pass of `warm` on a side stream
    (what a capture needs: allocator pools and lazy initialisation outside the graph).
time_cuda(fns, inner=..., reps=...) -> median ms per call: event_times around CUDA-graph replays
    of `fns` (a list of callables, e.g. one per rotated input set so repeats do not hit in L2).
time_host(fn, reps) -> median ms per call with a host clock and device syncs (for CPU-side work).
kernel_events(run) -> [dict]: the GPU events (kernels, copies, sets: name, ts and dur in us, stream) of one
    call of `run` (e.g. a graph replay), by torch.profiler.
provenance(command) -> dict: gpu, driver, torch, triton, git sha (DDBENCH_GIT_SHA, else HEAD, +dirty
    when tracked files differ from it), date, command.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import torch

from ddbench.core.provenance import gpu_provenance


def event_times(fn, reps: int, warmup: int = 1, per_call: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    evs[0].record()
    for j in range(reps):
        fn()
        evs[j + 1].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) / per_call for a, b in zip(evs[:-1], evs[1:])]


def capture_graph(body, warm) -> "torch.cuda.CUDAGraph":
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for f in warm:
            f()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    return g


def time_cuda(fns, *, inner: int = 5, reps: int = 20, warmup: int = 3, graph: bool = True) -> float:
    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]

    def body():
        for _ in range(inner):
            for f in fns:
                f()

    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()
    run = body
    if graph:
        run = capture_graph(body, fns).replay
        run()
    return statistics.median(event_times(run, reps, warmup=0, per_call=inner * len(fns)))


def time_host(fn, reps: int = 5, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")     # the trace categories kernel_events keeps


def kernel_events(run) -> list[dict]:
    """The GPU events of one call of `run` under torch.profiler: name, ts and dur (us), stream (the trace's
    stream, else its thread id, as text), in the trace's order."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        run()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        p.export_chrome_trace(path)
        with open(path, encoding="utf-8") as fh:
            tr = json.load(fh)
    return [dict(name=x["name"], ts=x["ts"], dur=x["dur"], stream=str(x.get("args", {}).get("stream", x.get("tid"))))
            for x in tr.get("traceEvents", []) if x.get("ph") == "X" and x.get("cat") in GPU_EVENTS]


def provenance(command: str) -> dict:
    """This GPU's provenance (ddbench.core.provenance.gpu_provenance, with this process's torch and triton)."""
    import triton
    return gpu_provenance(command, torch, triton)
