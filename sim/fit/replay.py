"""Replaying one engine point in the simulator: what the fits (sim/fit/cachefill.py) and the validation
(sim/fit/validation.py) share. An engine point of a sweep's engine.csv (kernels/engine/sweep.py) is
priced exactly as the user's `ddbench simulate --design D --context C --batch B --hit-rate (1 - miss)`
prices it: sim.steplayers.step_layers on the cost model of sim/setup.py, then the per-layer timeline.

- Miss rate: the engine forces round(rate * k) of the k = budget / chunk predicted chunks of every
  (request, head) to miss, so the replay uses that effective rate on every layer as its hit rate
  (1 - it) and, for ShadowKV, its reuse rate; then the planned link bytes are the engine's to the byte.
- `transfers = 0` rows (compute only, no host reads) are replayed with the plan's link work removed
  (and ShadowKV's fetch with it: the engine skips it).
- A chunk-cache design's rates are the chunks its cache really moved at the point (engine_cache_rates).

Regime of a point (classify): compute-only (no transfers); link-bound (engine link bytes per step /
engine step >= LINK_BOUND x the thin-gather rate measured in the same engine run, meta.json); overlap
(the rest). Imports no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

MODEL, GPU, LINK = "llama-3-8b", "h200", "pcie5"
LINK_BOUND = 0.75      # share of the measured gather rate the engine's link must sustain
STEPS, WARMUP = D.STEPS, min(2, D.STEPS - 1)   # the timeline as `ddbench simulate --batch N` runs it
MIB = 2 ** 20
COMPLETED = ("ok", "ok-no-twin")   # measured (ok-no-twin: no compute-only twin to split off the exposure)


def load_meta(engine_dir: str) -> dict:
    """An engine sweep's meta.json, checked: one-line errors naming the file and the field."""
    path = os.path.join(engine_dir, "meta.json")
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise DDBenchError(f"{path}: no such file") from None
    except OSError as e:
        raise DDBenchError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise DDBenchError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    except UnicodeDecodeError:
        raise DDBenchError(f"{path}: not UTF-8 text") from None
    if not isinstance(meta, dict):
        raise DDBenchError(f"{path}: the top level is not an object")
    for k in ("copy_h2d_gbps", "thin_gather_gbps"):
        if isinstance(meta.get(k), bool) or not isinstance(meta.get(k), (int, float)) or not meta[k] > 0:
            raise DDBenchError(f"{path}, field {k}: missing or not a positive number")
    if not isinstance(meta.get("provenance", {}) or {}, dict):
        raise DDBenchError(f"{path}, field provenance: not an object")
    return meta


def effective_miss(rate: float, budget: int, chunk: int) -> float:
    """The engine's forced miss rate: round(rate * k) of k = budget / chunk chunks per (request, head)."""
    k = budget // chunk
    return round(rate * k) / k


def engine_cache_rates(r, model: str):
    """A chunk-cache design's rates at an engine point: the chunks its cache really moved per step (the
    row's prefetch and urgent bytes, its forced churn and misses through its own LRU cache) over the
    budget's; the replay takes the workload's rates from the engine as it takes the forced miss rate."""
    from ddbench.core.cacherates import forced
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload, kv_piece_bytes
    m, w = get_model(model), Workload(context=int(r.context), kv_bits=row_kv_bits(r))
    full = int(r.batch) * m.num_layers * m.num_kv_heads * (w.budget // w.chunk) * 2 * kv_piece_bytes(m, w)
    pf, ur = float(r.prefetch_mib) * MIB / full, float(r.urgent_mib) * MIB / full
    return forced(min(pf, 1.0), min(ur, 1.0), m.num_layers,
                  f"the engine's moved chunks: prefetched {pf:.3f}, urgent {ur:.3f} of the budget per step")


def replay_plan(design: str, context: int, batch: int, miss: float, transfers: bool, cm=None, model: str = MODEL,
                cache=None, cache_tokens: int | None = None, kv_bits: int = 16):
    """The simulator's plan of one engine point: exactly the user's (`ddbench simulate --design design
    --context context --batch batch --hit-rate 1-miss`: step_layers at hit = reuse = 1 - miss on every
    layer), with the link work (and ShadowKV's fetch) removed where the engine ran compute only. No
    harness term (with_harness adds it)."""
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload
    from ddbench.core.designs import get_design
    from sim.steplayers import step_layers
    from sim.setup import cost_model
    m = get_model(model)
    cm = cm or cost_model(model, GPU, LINK)
    hit = [1.0 - miss] * m.num_layers
    w = Workload(context=context, batch=batch, kv_bits=kv_bits,
                 **({} if cache_tokens is None else {"cache_tokens": int(cache_tokens)}))
    plan = step_layers(get_design(design), m, cm, w, batch, context, hit, hit, cache=cache)
    if not transfers and plan.rates is not None:   # compute only: no host reads, nothing on the link
        z = [0.0] * m.num_layers
        plan = replace(plan, pf_bytes=z, ur_bytes=z, d2h_bytes=z, pf_work=z, ur_work=z, d2h_work=z,
                       cpu_pf_work=z, cpu_ur_work=z, rates=None, ur_min_s=[], ur_serial=False)
    return plan


def classify(transfers: int, link_gbps: float, thin_gbps: float) -> str:
    if not transfers:
        return "compute-only"
    if link_gbps >= LINK_BOUND * thin_gbps:
        return "link-bound"
    return "overlap"


def point_step_s(plan) -> tuple:
    """(steady step seconds, the timeline) of a plan in the timeline mode, as `ddbench simulate --batch`
    runs it (D.STEPS batch steps, 2 warm-up)."""
    from sim.timeline import run_timeline
    tl = run_timeline(plan, steps=STEPS, warmup=WARMUP)
    return tl.steady_step_s, tl


def row_model(r) -> str:
    """The row's model (sweeps before the --model flag measured MODEL only)."""
    m = getattr(r, "model", None)
    return m if isinstance(m, str) and m else MODEL


def row_kv_bits(r) -> int:
    """The engine row's kv_bits (rows before the fp8 switch have none: 16)."""
    v = getattr(r, "kv_bits", None)
    return 16 if v is None or v != v or v == "" else int(v)


def row_cache(r, model):
    """(cache rates, cache tokens) of a chunk-cache design's engine row, else (None, None)."""
    from ddbench.core.designs import get_design
    if not get_design(r.design).chunk_cache:
        return None, None
    return engine_cache_rates(r, model), int(getattr(r, "cache_tokens"))


def rel(path: str) -> str:
    """A folder under the data root's parent as 'traces/...', else as given."""
    base = os.path.realpath(str(traces_dir().parent))
    full = os.path.realpath(path)
    return os.path.relpath(full, base) if full.startswith(base + os.sep) else path
