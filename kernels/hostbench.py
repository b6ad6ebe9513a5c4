"""What a multi-GPU host does to offloaded KV: every GPU of a set fetching from pinned host memory at once.

    python -m ddbench.kernels.hostbench [--gpus 1,2,4,8] [--seconds 2] [--engine] [--out DIR] [--force]
    (or `ddbench bench host ...`)

For each count n of --gpus (at most the GPUs visible), n processes, one per GPU 0..n-1 (torch
multiprocessing, spawn; NCCL is not used), each with its CPU affinity set to its GPU's NUMA-local CPUs
before it allocates (so that its pinned buffer is first touched on that node, where /sys names one),
wait at one barrier and then each run, for --seconds:
  copy       the pinned host-to-device big copy (256 MiB per call, the copy engine)
  gather4k   the UVA gather of 4 KiB pieces (kernels/calibrate.py uva_copy: 32 persistent blocks,
  gather2k   random pieces of a 1 GiB pinned buffer, 256 MiB per call) and of 2 KiB pieces
  engine     with --engine: DualDecoder's and ShadowKV's CUDA-graph decode steps at 128K, batch 32,
             25 % forced misses (kernels/engine/sweep.py run_point: its pinned host KV per GPU)
one test at a time, all n GPUs together; each worker times its own loop with CUDA events after the
barrier. Rows (host.csv): gpus_fetching, gpu_index, test, piece_bytes, calls, bytes, seconds, gbps (bytes
over seconds; for engine rows tokens_per_s and step_ms too), numa_node, affinity_set; topology.json
holds the host's layout (ddbench/core/hosttopo.py) and the provenance. NVLink multicast is left off
(NCCL_NVLS_ENABLE=0 in every worker's environment).
"""

from __future__ import annotations

import os
import sys
import time

from ddbench.core.designs import DUALDECODER, SHADOWKV
from ddbench.core.errors import DDBenchError
from ddbench.core.flags import OneLineParser

MIB, GIB = 1 << 20, 1 << 30
CALL_BYTES = 256 * MIB
HOST_BYTES = GIB
TESTS = (("copy", 0), ("gather4k", 4096), ("gather2k", 2048))
ENGINE_POINTS = ((DUALDECODER, 131072, 32), (SHADOWKV, 131072, 32))
COLUMNS = ("gpus_fetching", "gpu_index", "test", "piece_bytes", "calls", "bytes", "seconds", "gbps", "tokens_per_s",
           "step_ms", "numa_node", "affinity_set", "pci_bus_id")


def _timed_loop(fn, seconds: float, per_check: int = 4) -> tuple[int, float]:
    """(calls, GPU seconds) of fn() repeated until `seconds` of wall time have passed, timed with CUDA
    events around the whole loop (synchronising every `per_check` calls to read the clock)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, t0 = 0, time.perf_counter()
    start.record()
    while True:
        for _ in range(per_check):
            fn()
        calls += per_check
        torch.cuda.synchronize()
        if time.perf_counter() - t0 >= seconds:
            break
    end.record()
    torch.cuda.synchronize()
    return calls, start.elapsed_time(end) / 1e3


def _worker(gpu: int, n: int, seconds: float, engine: bool, barrier, queue, topo_gpus: list) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    info = topo_gpus[gpu] if gpu < len(topo_gpus) else {}
    node, affinity = info.get("numa_node"), False
    try:
        from ddbench.core.hosttopo import numa_of
        _, cpus = numa_of(info["pci_bus_id"]) if info.get("pci_bus_id") else (None, [])
        if cpus and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, cpus)
            affinity = True
        import torch
        from ddbench.kernels.calibrate import uva_copy
        torch.cuda.set_device(gpu)
        base = dict(gpus_fetching=n, gpu_index=gpu, numa_node=node, affinity_set=affinity,
                    pci_bus_id=info.get("pci_bus_id", ""), tokens_per_s=None, step_ms=None)
        host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
        host.random_()
        dev = torch.empty(CALL_BYTES, dtype=torch.uint8, device="cuda")
        rows = []
        for test, piece in TESTS:
            if piece:
                src, dst = host.view(-1, piece).view(torch.bfloat16), dev.view(-1, piece).view(torch.bfloat16)
                g = torch.Generator().manual_seed(gpu)
                sid = torch.randint(0, src.shape[0], (dst.shape[0],), generator=g).cuda()
                did = torch.arange(dst.shape[0], device="cuda")
                fn = lambda: uva_copy(src, sid, dst, did, blocks=32)     # noqa: E731
            else:
                fn = lambda: dev.copy_(host[:CALL_BYTES], non_blocking=True)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            barrier.wait()
            calls, secs = _timed_loop(fn, seconds)
            rows.append(dict(base, test=test, piece_bytes=piece, calls=calls, bytes=calls * CALL_BYTES, seconds=secs,
                             gbps=calls * CALL_BYTES / secs / 1e9))
        del host, dev
        if engine:
            rows += _engine_rows(base, seconds, barrier)
        queue.put(("ok", gpu, rows))
    except Exception as exc:  # noqa: BLE001 - a worker's failure is a result; the others must not hang
        barrier.abort()
        queue.put(("error", gpu, f"{type(exc).__name__}: {exc}"))


def _engine_rows(base: dict, seconds: float, barrier) -> list[dict]:
    import torch
    from ddbench.core.catalog import get_model
    from ddbench.kernels.engine.model import Weights
    from ddbench.kernels.engine.points import PointSetup, PointTiming, alloc_host, run_point
    model = get_model("llama-3-8b")
    weights = Weights.random(model, "cuda", seed=0)
    flat = alloc_host(8)[0]
    rows = []
    for design, ctx, batch in ENGINE_POINTS:
        row, e = run_point(PointSetup(model, weights, flat, log=lambda *_: None), design, ctx, batch,
                           PointTiming(0.25, reps=3), keep=True)
        barrier.wait()
        calls, secs = _timed_loop(e.replay, seconds, per_check=1)
        step = secs / (2 * calls)                       # a replay is 2 steps (kernels/engine/sweep.py)
        rows.append(dict(base, test=f"engine-{design}", piece_bytes=0, calls=calls, bytes=row["link_mib"] * MIB * 2 * calls,
                         seconds=secs, gbps=row["link_mib"] * MIB * 2 * calls / secs / 1e9, step_ms=step * 1e3,
                         tokens_per_s=batch / step))
        del e
        torch.cuda.empty_cache()
    return rows


def run(counts: list[int], seconds: float, engine: bool, log=print) -> tuple[list[dict], dict]:
    """Rows of every count (each a fresh set of processes) and the topology."""
    import torch
    import torch.multiprocessing as mp
    from ddbench.core.hosttopo import topology
    topo = topology()
    ctx = mp.get_context("spawn")
    rows = []
    for n in counts:
        barrier, queue = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(g, n, seconds, engine, barrier, queue, topo["gpus"]))
                 for g in range(n)]
        for p in procs:
            p.start()
        try:
            got = [queue.get(timeout=1800) for _ in procs]
        except Exception:  # noqa: BLE001 - queue.Empty: a worker died without a word
            for p in procs:
                p.kill()
            raise DDBenchError(f"hostbench with {n} GPUs: a worker died without reporting (exit codes"
                               f" {[p.exitcode for p in procs]})") from None
        for p in procs:
            p.join()
        bad = [g for status, g, _ in got if status != "ok"]
        if bad:
            raise DDBenchError(f"hostbench with {n} GPUs: GPU {bad[0]} failed: "
                               + next(r for s, g, r in got if g == bad[0]))
        for _, _, rs in sorted(got, key=lambda x: x[1]):
            rows += rs
        log(f"[host] {n} GPU(s): " + ", ".join(f"{t} {summarise(rows, n, t)['per_gpu_gbps']:.1f} GB/s per GPU"
                                                for t, _ in TESTS))
    topo["torch_devices"] = torch.cuda.device_count()
    return rows, topo


def summarise(rows: list[dict], n: int, test: str) -> dict:
    """Per-GPU mean and aggregate GB/s (and tokens/s) of one test with n GPUs fetching."""
    sel = [r for r in rows if r["gpus_fetching"] == n and r["test"] == test]
    if not sel:
        return {"gpus": 0, "per_gpu_gbps": float("nan"), "total_gbps": float("nan")}
    tot = sum(r["gbps"] for r in sel)
    out = {"gpus": len(sel), "per_gpu_gbps": tot / len(sel), "total_gbps": tot,
           "min_gpu_gbps": min(r["gbps"] for r in sel)}
    if sel[0].get("tokens_per_s") is not None:
        out["per_gpu_tokens_per_s"] = sum(r["tokens_per_s"] for r in sel) / len(sel)
    return out


def check_counts(text: str, visible: int) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8], each from 1 to the GPUs visible: one-line DDBenchError otherwise."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise DDBenchError(f"--gpus takes a comma list of GPU counts, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise DDBenchError(f"--gpus counts must be at least 1, got {text!r}")
    if max(counts) > visible:
        raise DDBenchError(f"--gpus {max(counts)}: only {visible} GPU(s) visible here")
    return sorted(set(counts))


def main(argv=None) -> int:
    import json
    ap = OneLineParser(prog="python -m ddbench.kernels.hostbench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default=None, help="comma list of GPU counts fetching at once (default 1,2,4,8 up to"
                                                 " the GPUs visible)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per test and count (default 2)")
    ap.add_argument("--engine", action="store_true", help="also DualDecoder's and ShadowKV's engine steps at 128K")
    ap.add_argument("--out", default=None, help="output folder (default the data root's host/<gpu>-x<GPUs visible>)")
    ap.add_argument("--force", action="store_true", help="replace an earlier run's files (ddbench's own only)")
    a = ap.parse_args(argv)
    try:
        import torch
        if not torch.cuda.is_available():
            raise DDBenchError("the host bench needs CUDA GPUs; none is visible to torch")
        if not 0.1 <= a.seconds <= 600:
            raise DDBenchError(f"--seconds must be within 0.1..600, got {a.seconds}")
        visible = torch.cuda.device_count()
        counts = check_counts(a.gpus or ",".join(str(n) for n in (1, 2, 4, 8) if n <= visible), visible)
        from ddbench.core.catalog.gpus import catalog_gpu_name
        from ddbench.core.io import write_rows_csv
        from ddbench.core.outputs import output_folder
        from ddbench.core.paths import traces_dir
        from ddbench.kernels.timing import provenance
        gpu = catalog_gpu_name(torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).total_memory)
        out = a.out or str(traces_dir("host", f"{gpu}-x{visible}"))
        prov = provenance(" ".join(["python -m ddbench.kernels.hostbench"] + list(argv if argv is not None else sys.argv[1:])))
        with output_folder(out, command="python -m ddbench.kernels.hostbench", force=a.force) as w:
            w.claim(["host.csv", "topology.json"])
            rows, topo = run(counts, a.seconds, a.engine)
            write_rows_csv(w.stage_path("host.csv"), rows, COLUMNS, prov)
            summary = {f"{n} {t}": summarise(rows, n, t) for n in counts
                       for t in [t for t, _ in TESTS] + ([f"engine-{d}" for d, _, _ in ENGINE_POINTS] if a.engine else [])}
            with open(w.stage_path("topology.json"), "w", encoding="utf-8") as fh:
                json.dump({"provenance": prov, "topology": topo, "summary": summary, "seconds": a.seconds,
                           "call_bytes": CALL_BYTES, "host_bytes": HOST_BYTES}, fh, indent=1)
    except DDBenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
