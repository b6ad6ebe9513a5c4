"""The engine sweep's `paper` phase: the paper's own points (Figs. 2, 3, 12 and 14), measured.

    python -m kernels.engine.sweep --phases paper --model qwen2.5-32b --contexts 64k,128k,256k \
        --gpu-mem-cap h100-80gb [--reps 3] [--max-batch 4096] [--budget-s 400]

For one model, every context of --contexts and each design of DESIGNS: the largest batch that fits
under the GPU memory cap, found by search_largest (doubling from batch 1, then the batch the memory
prediction puts largest, then bisection where the prediction was wrong), each batch tried a full
engine point with transfers on (kernels/engine/sweep.run_point: --reps timed CUDA-graph replays of two
steps each, min / median / max). The batches the search measured are the throughput-against-batch
series (Figs. 2, 3); every row has the GPU memory at its peak by category (Fig. 14) and the memory
model's largest batch for the same point (ddbench.core.memory.max_batch).

The cap (--gpu-mem-cap GB, or a catalog GPU's memory: h100-80gb) emulates a smaller GPU: the CUDA
context and cuBLAS (measured at start, outside torch's allocator) count against it, torch's allocator
is limited to the rest (torch.cuda.set_per_process_memory_fraction), and a batch whose planned bytes
(the weights and the engine's own tensors, kernels.engine.engine.plan_bytes) exceed that limit is
refused before anything is allocated. A batch "does not fit" only where its plan is over the limit
or where it ran out of memory.

Host KV: a --host-gib pinned buffer viewed by kernels.layout.host_kv_view; a point whose host KV
exceeds it reads aliased layers, then aliased requests (rows say which: host_alias). Every chunk
still crosses the link; only the values repeat.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field

from ddbench.core.errors import DDBenchError

PAPER = "paper"
DESIGNS = ("dualdecoder", "shadowkv", "specache", "full-kv")   # the headline pair first (budget cuts the tail)
DEFAULT_CONTEXTS = (131072,)
QUICK = dict(contexts=(32768,), max_batch=4)                     # --quick: a smoke of the phase
MAX_BATCH = 4096
POINT_FIXED_S = 3.0       # building an engine and capturing its graph, beside its steps (the time budget's estimate)
GIB = 1 << 30


class Stop(Exception):
    """The search of a design ends here; `basis` says why (time, host-limit, error)."""
    basis = "stopped"

    def __init__(self, basis=None):
        super().__init__(basis or self.basis)
        self.basis = basis or self.basis


class TimeUp(Stop):
    """The time budget leaves no room for the next point."""
    basis = "time"


# ------------------------------------------------------------------ the cap

def parse_cap(text: str | None) -> tuple[int | None, str]:
    """--gpu-mem-cap: GB (1e9 bytes) or a catalog GPU name (its memory) -> (bytes, label); None: no cap."""
    if text is None:
        return None, "none"
    try:
        gb = float(text)
    except ValueError:
        from ddbench.core.catalog.gpus import get_gpu
        try:
            g = get_gpu(text)
        except DDBenchError as exc:
            raise DDBenchError(f"--gpu-mem-cap takes GB or a catalog GPU name: {exc}") from None
        return g.hbm_bytes, g.name
    if not math.isfinite(gb) or gb <= 0:
        raise DDBenchError(f"--gpu-mem-cap must be a positive number of GB or a GPU name, got {text!r}")
    return int(gb * 1e9), f"{gb:g}gb"


def check_cap(cap: int | None, model, total: int | None = None) -> None:
    """One-line DDBenchError for a cap at or below the model's weights, or above the GPU's memory."""
    if cap is None:
        return
    from kernels.engine.model import weight_bytes
    w = weight_bytes(model)
    if cap <= w:
        raise DDBenchError(f"--gpu-mem-cap {cap / 1e9:.1f} GB is not above {model.name}'s weights ({w / 1e9:.1f} GB)")
    if total is not None and cap > total:
        raise DDBenchError(f"--gpu-mem-cap {cap / 1e9:.1f} GB is above this GPU's memory ({total / 1e9:.1f} GB)")


def cap_gpu(cap: int | None, label: str, device_gpu: str):
    """The catalog GPU the memory model prices the point on: the named one, else this GPU with the cap."""
    from dataclasses import replace

    from ddbench.core.catalog.gpus import GPUS, get_gpu
    if label in GPUS:
        return GPUS[label]
    g = get_gpu(device_gpu) if device_gpu in GPUS else get_gpu("h200")
    return g if cap is None else replace(g, name=f"{g.name}-cap-{label}", hbm_bytes=cap)


# ------------------------------------------------------------------ the search

@dataclass
class Search:
    largest: int              # 0: not even batch 1 fits
    basis: str                # why largest + 1 is not the answer: planned | oom | max-batch | time | host-limit | error
    tried: dict = field(default_factory=dict)   # batch -> bytes in use at its peak (fits) or None


def search_largest(measure, planned, limit: int, max_batch: int) -> Search:
    """The largest batch <= max_batch that fits in `limit` bytes.

    measure(B) -> bytes in use at the point's peak, or None where it ran out of memory (it may raise
    Stop, e.g. TimeUp: the search ends with the largest batch so far); planned(B) -> the bytes known
    before allocating, exact and increasing in B. A batch whose plan exceeds the limit is refused
    without measuring. Doubling from 1 (each batch measured: the series) while the prediction fits;
    then the largest batch the prediction fits, then its next one, and plain bisection once the
    prediction has been wrong. The prediction is planned(B) plus the workspace (in use - planned) of
    the two largest batches that fit, extended linearly."""
    tried: dict = {}

    def fits(B):
        if B not in tried:
            tried[B] = None if planned(B) > limit else measure(B)
        return tried[B] is not None

    def predict(B):
        ok = sorted(b for b, u in tried.items() if u is not None)[-2:]
        if not ok:
            return planned(B)
        ws = [tried[b] - planned(b) for b in ok]
        slope = max(0.0, (ws[1] - ws[0]) / (ok[1] - ok[0])) if len(ok) == 2 else 0.0
        return planned(B) + max(0.0, ws[-1] + slope * (B - ok[-1]))

    lo, hi = 0, max_batch + 1
    try:
        B = 1
        while B < hi:
            if not fits(B):
                hi = B
                break
            lo = B
            if 2 * B >= hi or predict(2 * B) > limit:
                break
            B *= 2
        guided = True
        while hi - lo > 1:
            if guided:
                a, b = lo, hi                         # the largest batch the prediction fits
                while b - a > 1:
                    m = (a + b) // 2
                    a, b = (m, b) if predict(m) <= limit else (a, m)
                cand, predicted = (a, True) if a > lo else (lo + 1, False)
            else:
                cand, predicted = (lo + hi) // 2, None
            ok = fits(cand)
            lo, hi = (cand, hi) if ok else (lo, cand)
            if predicted is not None and ok != predicted and planned(cand) <= limit:
                guided = False                        # the prediction was wrong: bisect
    except Stop as exc:
        return Search(lo, exc.basis, tried)
    if lo == max_batch:
        return Search(lo, "max-batch", tried)
    return Search(lo, "planned" if planned(hi) > limit else "oom", tried)


# ------------------------------------------------------------------ the phase

def paper_key(model, cap_label, ctx, design, batch=None) -> str:
    """rows.jsonl keys: one per measured batch, and a 'paper-done' marker per searched design."""
    if batch is None:
        return json.dumps(["paper-done", model, cap_label, ctx, design])
    return json.dumps([PAPER, model, cap_label, ctx, design, batch])


def run_paper(model, weights, flat, contexts, *, cap, cap_label, limit, mem_gpu, overhead, reps, max_batch,
              miss_rate, hbm, deadline, done, append, current=lambda key: None, seed=0, log=print):
    """Every design of DESIGNS at every context: search_largest on engine points. Returns the rows (the
    search's batches, each measured or refused, with the largest batch and its basis on every row of
    the design's search). `done`: rows.jsonl entries of an earlier run (a design already searched is
    taken from them: --resume); `append(key, row)` records a row (row None: the done marker);
    `current(key)` names the point about to run (a crash leaves it behind)."""
    import gc

    import torch

    from kernels.engine.engine import plan_bytes
    from kernels.engine.sweep import design_spec, make_config, run_point
    rows = []
    cap_gib = None if cap is None else cap / GIB
    for ctx in contexts:
        for d in DESIGNS:
            dkey = paper_key(model.name, cap_label, ctx, d)
            prefix = paper_key(model.name, cap_label, ctx, d, 0)[:-2]
            if dkey in done:
                rows += [e["row"] for k, e in done.items() if k.startswith(prefix) and e.get("row")]
                continue
            gc.collect()
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()      # the weights (and anything else resident)
            spec = design_spec(d)
            miss = None if spec.kv_on_gpu else miss_rate
            mine, steps = [], []

            def cfg(B):     # SpeCache holds its 2-bit values too: the design's whole residency
                return make_config(ctx, B, miss, True, seed=seed, quant_values=True)

            def planned(B):
                return base + sum(plan_bytes(model, spec, cfg(B)).values())

            def point(B):
                key = paper_key(model.name, cap_label, ctx, d, B)
                current(key)
                t0 = time.perf_counter()
                try:
                    r = run_point(model, weights, flat, d, ctx, B, miss_rate=miss, transfers=True, graph=True,
                                  reps=reps, hbm=hbm, cfg=cfg(B), limit=limit, mem_gpu=mem_gpu, overhead=overhead,
                                  seed=seed, log=log)
                except Exception as exc:  # noqa: BLE001 - reported in the row; the phase goes on
                    import traceback
                    log(f"  {d} ctx={ctx} B={B}: ERROR\n" + traceback.format_exc(limit=8))
                    r = dict(model=model.name, design=d, context=ctx, batch=B, transfers=1, graph=1,
                             miss_rate="none" if miss is None else miss, urgent_programs=64, status="error",
                             error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
                    gc.collect()
                    torch.cuda.empty_cache()
                r.update(phase=PAPER, rep=0, gpu_mem_cap=cap_label, cap_gib=cap_gib, wall_s=time.perf_counter() - t0)
                mine.append(r)
                append(key, r)
                return r

            def measure(B):
                # the next point's time: its step executions (pre-decode, warm-up, a warm-up replay and
                # `reps` replays of 2 steps) at the last step time scaled by the batch, + building and
                # capturing (compiles excluded: they fall on the first points)
                est = POINT_FIXED_S + (4 + 2 * reps) * steps[-1][1] * B / steps[-1][0] if steps else 0.0
                if time.perf_counter() + est > deadline:
                    raise TimeUp
                r = point(B)
                if r["status"] in ("host-limit", "error"):
                    raise Stop(r["status"])
                if r["status"] != "ok":
                    return None
                steps.append((B, r["step_ms"] / 1e3))
                return r["peak_reserved_gib"] * GIB

            res = search_largest(measure, planned, limit, max_batch)
            if not mine and res.basis == "time":
                mine.append(dict(phase=PAPER, rep=0, model=model.name, design=d, context=ctx, batch=1,
                                 miss_rate="none" if miss is None else miss, transfers=1, graph=1, urgent_programs=64,
                                 gpu_mem_cap=cap_label, cap_gib=cap_gib, status="skipped-time"))
            elif not mine:                            # batch 1 refused by its plan: its row says how far over
                point(1)
            nxt = planned(res.largest + 1) / GIB
            for r in mine:
                r.update(largest_batch=res.largest, largest_basis=res.basis, next_planned_gib=nxt,
                         paper_role=("largest" if r["batch"] == res.largest and r["status"] == "ok" else
                                     "series" if r["status"] == "ok" else "trial"))
                append(paper_key(model.name, cap_label, ctx, d, r["batch"]), r)
            if res.basis not in ("time", "error"):      # a resumed run searches these again
                append(dkey, None)
            log(f"  [paper] {model.name} {ctx // 1024}K cap {cap_label}: {d} largest batch {res.largest}"
                f" ({res.basis}; memory model {mine[0].get('model_max_batch')})")
            rows += mine
    return rows


def summarize(rows) -> list[dict]:
    """Per (model, cap, context, design): the largest batch and its tokens/s (min / median / max over
    replays), the memory model's largest batch, the series and the memory by category at the largest."""
    out = {}
    for r in rows:
        if r.get("phase") != PAPER:
            continue
        k = (r.get("model"), r.get("gpu_mem_cap"), r["context"], r["design"])
        e = out.setdefault(k, dict(model=k[0], gpu_mem_cap=k[1], context=k[2], design=k[3],
                                   largest_batch=r.get("largest_batch"), largest_basis=r.get("largest_basis"),
                                   model_max_batch=r.get("model_max_batch"), series=[]))
        if r.get("status") == "ok" and r.get("step_ms"):
            e["series"].append(dict(batch=r["batch"], tok_s=r["tok_s"], tok_s_min=r.get("tok_s_min"),
                                    tok_s_max=r.get("tok_s_max"), peak_gib=r.get("peak_gib")))
            if r.get("paper_role") == "largest":
                e["largest"] = {c: r.get(c) for c in r if c.startswith("mem_") or c in (
                    "tok_s", "tok_s_min", "tok_s_max", "step_ms", "peak_gib", "peak_reserved_gib", "planned_gib",
                    "link_gbps", "host_alias")}
    for e in out.values():
        e["series"].sort(key=lambda s: s["batch"])
    return list(out.values())
