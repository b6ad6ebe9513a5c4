"""Does the skinny split-K Triton GEMM (skinny.py) beat cuBLAS on the decode step's linear layers? (H200)

    PYTHONPATH=. python -m kernels.engine.devcheck_skinny [--quick] [--reps 3] [--budget-s 130]
        [--jobs 8] [--out FILE.json]

Llama-3-8B's four linear layers (qkv 4096x6144, o 4096x4096, down 14336x4096 with w stored [K, N];
gate_up 4096x28672 stored [N, K], as the engine has them), bf16, at M = 1, 2, 16, 32, 64, 128 rows
(--quick: 2, 32, 128). Per (layer, M): cuBLAS (`x @ w`, or `x @ w.t()` for gate_up) against the
candidate configs of `skinny.candidate_configs` (12, ranked by its model). Each config's output is
first checked against cuBLAS's (bf16 tolerances); one that fails to compile or to match is recorded
with its first error line and skipped. Methodology of devcheck_gemm.py: each timing is a CUDA graph of
8 GEMMs over 8 distinct weight copies (no L2 reuse), the median of 20 replays / 8; floor = weight bytes
/ the device-to-device copy rate of the same run.

Pruning, to stay within about 150 s of device time with the compiles: (1) the distinct kernels
(what Triton specializes on: compile_key) are compiled first into Triton's on-disk cache by
--jobs worker processes (Triton's warmup, no tensors; at most half the budget); (2) the sweep
times every candidate once; (3) only the two fastest and cuBLAS are re-timed, --reps repetitions
interleaved; (4) no config starts after --budget-s seconds from the start, and each (layer, M)
gets an equal share of what is left when it starts (candidates in model order: the skipped ones
are the model's least likely), so the JSON is always written and every point has cuBLAS and some
candidates. Output: one line per (layer, M, config), a summary per (layer, M), and with --out the
rows, the best config per point (its median ms, ratio to floor, cuBLAS's) and the compile record.
Not run on the device yet (suggested output: traces/engine/h200/devcheck-skinny.json).
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, wait

import torch

from kernels.engine.skinny import candidate_configs, model_us

SHAPES = {"qkv": (4096, 6144, "kn"), "o": (4096, 4096, "kn"), "gate_up": (4096, 28672, "nk"),
          "down": (14336, 4096, "kn")}
MS = (1, 2, 16, 32, 64, 128)
QUICK_MS = (2, 32, 128)
CANDIDATES = 12
COPIES = 8
TOL = dict(rtol=2e-2, atol=3e-2)       # outputs ~ N(0, 1); cuBLAS may reduce split-K partials in bf16


def plan(quick: bool = False, limit: int = CANDIDATES, sm_count: int = 132) -> list:
    """[(layer, M, [configs in model order])], layers in SHAPES order."""
    return [(name, M, candidate_configs(M, K, N, layout, sm_count, limit))
            for name, (K, N, layout) in SHAPES.items() for M in (QUICK_MS if quick else MS)]


def compile_key(M, K, N, layout, cfg) -> tuple:
    """What one compiled kernel covers: the constexprs, and how Triton specializes the ints (== 1,
    multiple of 16; M is not specialized, k_per_split is always a multiple of 16)."""
    split = 1 if cfg.split_k == 1 else 16 if cfg.split_k % 16 == 0 else 2
    return (layout, cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages, split,
            K % cfg.block_k == 0, N % cfg.block_n == 0, K % 16 == 0, N % 16 == 0)


def compile_plan(points) -> list:
    """One (M, K, N, layout, config) per distinct compile_key, in first-use order."""
    keys: dict = {}
    for name, M, cfgs in points:
        K, N, layout = SHAPES[name]
        for cfg in cfgs:
            keys.setdefault(compile_key(M, K, N, layout, cfg), (M, K, N, layout, cfg))
    return list(keys.values())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _compile_one(item) -> str | None:
    try:
        from kernels.engine.skinny import precompile
        precompile(*item)
        return None
    except Exception as exc:  # recorded, the sweep goes on
        return _first_line(exc)


def precompile_all(items, jobs: int, timeout_s: float) -> dict:
    """Compile `items` in `jobs` spawned processes into Triton's cache; stop waiting after timeout_s."""
    t0 = time.perf_counter()
    rec = dict(jobs=jobs, kernels=len(items), compiled=0, failed={}, unfinished=0)
    if jobs < 1 or not items or timeout_s <= 0:
        rec.update(unfinished=len(items), wall_s=0.0)
        return rec
    ex = None
    try:
        ex = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))
        futs = {ex.submit(_compile_one, it): it for it in items}
        done, pending = wait(futs, timeout=timeout_s)
        for f in done:
            try:
                err = f.result()
            except Exception as exc:  # a worker died
                err = _first_line(exc)
            if err is None:
                rec["compiled"] += 1
            else:
                _, K, N, layout, cfg = futs[f]
                rec["failed"][f"{layout} K={K} N={N} {cfg.label}"] = err
        rec["unfinished"] = len(pending)
    except Exception as exc:  # no workers: the sweep compiles what it needs
        rec.update(error=_first_line(exc), unfinished=len(items) - rec["compiled"] - len(rec["failed"]))
    finally:
        if ex is not None:
            ex.shutdown(wait=False, cancel_futures=True)
    rec["wall_s"] = time.perf_counter() - t0
    return rec


def _graph_ms(fn):
    """(ms per GEMM, graph) of a graph of `fn` (COPIES GEMMs), median of 20 replays."""
    from kernels.timing import capture_graph, event_times
    g = capture_graph(fn, [fn])
    return statistics.median(event_times(g.replay, 20, warmup=3)) / COPIES, g


def run_point(name, M, cfgs, ws, floor_ms, point_deadline, reps, rows) -> dict:
    from kernels.engine.skinny import skinny_matmul
    K, N, layout = SHAPES[name]
    dev, bf = ws[0].device, torch.bfloat16
    x = torch.randn(M, K, device=dev, dtype=bf)
    mm = (lambda w: x @ w) if layout == "kn" else (lambda w: x @ w.t())
    ref = mm(ws[0]).float()
    outs = [torch.empty(M, N, device=dev, dtype=bf) for _ in ws]

    def cublas():
        return [mm(w) for w in ws]

    base = dict(layer=name, K=K, N=N, M=M, layout=layout, floor_ms=floor_ms)
    t_cublas, _ = _graph_ms(cublas)
    rows.append(dict(base, config="cublas", status="ok", sweep_ms=t_cublas, over_floor=t_cublas / floor_ms))
    timed, failed, skipped = [], 0, 0
    for cfg in cfgs:
        row = dict(base, config=cfg.label, **dataclasses.asdict(cfg), model_us=model_us(cfg, M, K, N, layout))
        if time.perf_counter() > point_deadline:
            skipped += 1
            rows.append(dict(row, status="skipped (budget)"))
            print(f"{name:8s} M={M:4d} {cfg.label:22s} skipped (budget)", flush=True)
            continue

        def fn(cfg=cfg):
            return [skinny_matmul(x, w, layout=layout, config=cfg, out=o) for w, o in zip(ws, outs, strict=True)]

        try:
            y = skinny_matmul(x, ws[0], layout=layout, config=cfg, out=outs[0]).float()
            torch.cuda.synchronize()
            row["max_abs_err"] = (y - ref).abs().max().item()
            if not torch.allclose(y, ref, **TOL):
                row["status"] = "mismatch"
            else:
                t, _ = _graph_ms(fn)
                row.update(status="ok", sweep_ms=t, over_floor=t / floor_ms)
                timed.append((t, cfg, fn))
        except Exception as exc:  # recorded, the sweep goes on
            row.update(status="error", error=_first_line(exc))
        failed += row["status"] != "ok"
        rows.append(row)
        shown = f"{row['sweep_ms'] * 1e3:7.1f} us ({row['over_floor']:.2f}x)" if row["status"] == "ok" else \
            f"{row['status']}: {row.get('error', row.get('max_abs_err'))}"
        model = "-" if row["model_us"] is None else f"{row['model_us']:.1f}"
        print(f"{name:8s} M={M:4d} {cfg.label:22s} {shown}  cuBLAS {t_cublas * 1e3:7.1f} us "
              f"({t_cublas / floor_ms:.2f}x)  model {model} us", flush=True)
    # re-time the two fastest and cuBLAS, interleaved
    timed.sort(key=lambda r: r[0])
    variants = [("cublas", cublas)] + [(cfg.label, fn) for _, cfg, fn in timed[:2]]
    graphs = {v: _graph_ms(fn)[1] for v, fn in variants}
    from kernels.timing import event_times
    ms = {v: [] for v in graphs}
    for _ in range(reps):
        for v, g in graphs.items():
            ms[v].append(statistics.median(event_times(g.replay, 20, warmup=3)) / COPIES)
    del graphs
    med = {v: statistics.median(t) for v, t in ms.items()}
    by_label = {cfg.label: cfg for _, cfg, _ in timed[:2]}
    ranked = sorted(by_label, key=med.get)
    point = dict(base, cublas_ms=med["cublas"], cublas_ms_reps=ms["cublas"],
                 cublas_over_floor=med["cublas"] / floor_ms, tried=len(cfgs) - skipped, failed=failed,
                 skipped_budget=skipped, model_first=cfgs[0].label if cfgs else None)
    for slot, label in zip(("best", "runner_up"), ranked, strict=False):
        point[slot] = dict(config=label, **dataclasses.asdict(by_label[label]), ms=med[label], ms_reps=ms[label],
                           over_floor=med[label] / floor_ms, speedup_vs_cublas=med["cublas"] / med[label])
    return point


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="M in (2, 32, 128) only")
    ap.add_argument("--budget-s", type=float, default=130.0, help="start no config after this many seconds")
    ap.add_argument("--jobs", type=int, default=8, help="compile worker processes (0: compile in the sweep)")
    ap.add_argument("--candidates", type=int, default=CANDIDATES)
    a = ap.parse_args(argv)
    from kernels.timing import devcheck_refusal
    if (err := devcheck_refusal("devcheck_skinny", a.reps)):
        print(err, file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    deadline = t0 + a.budget_s
    from kernels.engine.bench import hbm_gbps
    from kernels.engine.skinny import clear_workspaces
    hbm = hbm_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    points = plan(a.quick, a.candidates, sms)
    kernels = compile_plan(points)
    compiles = precompile_all(kernels, a.jobs, min(a.budget_s / 2, deadline - time.perf_counter()))
    print(f"precompile: {compiles['compiled']}/{len(kernels)} kernels in {compiles['wall_s']:.1f} s with "
          f"{a.jobs} workers, {len(compiles['failed'])} failed, {compiles['unfinished']} unfinished", flush=True)
    rows, best = [], []
    dev, bf = torch.device("cuda"), torch.bfloat16
    left = len(points)
    try:
        for name, (K, N, layout) in SHAPES.items():
            w0 = torch.randn(K, N, device=dev, dtype=bf) * K ** -0.5
            w0 = w0 if layout == "kn" else w0.t().contiguous()
            ws = [w0.clone() for _ in range(COPIES)]                 # distinct memory: no L2 reuse
            del w0
            floor_ms = K * N * 2 / (hbm * 1e9) * 1e3
            for pname, M, cfgs in points:
                if pname != name:
                    continue
                now = time.perf_counter()
                best.append(run_point(name, M, cfgs, ws, floor_ms, now + max(0.0, deadline - now) / left,
                                      a.reps, rows))
                left -= 1
            del ws
            clear_workspaces()
            torch.cuda.empty_cache()
    finally:
        wall = time.perf_counter() - t0
        print(f"\n{'layer':8s} {'M':>4s}  {'cuBLAS':>16s}  {'best Triton':>16s}  speedup  config")
        for p in best:
            b = p.get("best")
            tri = f"{b['ms'] * 1e3:6.1f} us {b['over_floor']:.2f}x" if b else "none"
            print(f"{p['layer']:8s} {p['M']:4d}  {p['cublas_ms'] * 1e3:6.1f} us {p['cublas_over_floor']:.2f}x  "
                  f"{tri:>16s}  {b['speedup_vs_cublas'] if b else 0:.3f}  {b['config'] if b else ''}")
        wins = sum(1 for p in best if p.get("best") and p["best"]["speedup_vs_cublas"] > 1)
        print(f"faster than cuBLAS at {wins} of {len(best)} points; {wall:.0f} s", flush=True)
        if a.out:
            from ddbench.core.io import write_json
            from kernels.timing import provenance
            cmd = "python -m kernels.engine.devcheck_skinny " + " ".join(sys.argv[1:] if argv is None else argv)
            write_json(a.out, dict(provenance=provenance(cmd.strip()), hbm_copy_gbps=hbm, sm_count=sms,
                                   reps=a.reps, budget_s=a.budget_s, wall_s=wall, precompile=compiles,
                                   faster_than_cublas=wins, points=best, rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
