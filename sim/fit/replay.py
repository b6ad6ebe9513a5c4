"""Replaying one engine point in the simulator: what the fits (sim/fit/cachefill.py) and the validation
(sim/fit/validation.py) share. An engine point of a sweep's engine.csv (kernels/engine/sweep.py) is
priced exactly as the user's `ddbench simulate --design D --context C --batch B --hit-rate (1 - miss)`
prices it: ddbench.sim.steplayers.step_layers on the cost model of sim/factory.py, then the per-layer timeline.

- Miss rate: the engine forces round(rate * k) of the k = budget / chunk predicted chunks of every
  (request, head) to miss, so the replay uses that effective rate on every layer as its hit rate
  (1 - it) and, for ShadowKV, its reuse rate; then the planned link bytes are the engine's to the byte.
- `transfers = 0` rows (compute only, no host reads) are replayed with the plan's link work removed
  (and ShadowKV's fetch with it: the engine skips it).
- A chunk-cache design's rates are the chunks its cache really moved at the point (engine_cache_rates).
- Which ShadowKV step the engine ran (shadowkv_step): the in-place step (each layer's buffer kept in place,
  only the misses' values fetched by the 64-program urgent slot gather, only their keys rebuilt), which the
  user's plan prices (sim/steplayers.py); or, in an older engine, the copy-then-regather step, which the
  user's plan no longer prices: the fits and the validation add it to such rows only, as a term of that
  engine of their own (legacy_reuse_fetch: the key rebuild of every selected slot, and the fetch
  CostModel.reuse_fetch_s on the compute stream before it).
- Which chunk-cache fill the engine ran (cache_fill_kind): the fused fill with int32 sort keys beside pass
  1's 16 splits (FUSED: the user's cost model prices it, Fitted.cache_fill); or an older engine's, the fused
  fill with int64 keys (FUSED64, Fitted.cache_fill_int64) or about 30 small torch kernels (TORCH,
  Fitted.cache_fill_torch), each fitted to that engine's rows and pricing such rows only.
- Both are data recorded with the runs (engine_version): the run's meta.json field `engine`, else
  traces/fit/engine-versions.json by the run's git sha (the row's git_sha, else its meta.json provenance;
  a "+dirty" suffix dropped). A run in neither is an error, never a guess.

Regime of a point (classify): compute-only (no transfers); link-bound (engine link bytes per step /
engine step >= LINK_BOUND x the thin-gather rate measured in the same engine run, meta.json); overlap
(the rest). Imports no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from functools import lru_cache

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

MODEL, GPU, LINK = "llama-3-8b", "h200", "pcie5"
LINK_BOUND = 0.75      # share of the measured gather rate the engine's link must sustain
STEPS, WARMUP = D.STEPS, min(2, D.STEPS - 1)   # the timeline as `ddbench simulate --batch N` runs it
MIB = 2 ** 20
COMPLETED = ("ok", "ok-no-twin")   # measured (ok-no-twin: no compute-only twin to split off the exposure)
IN_PLACE, COPY_REGATHER = "in-place", "copy-regather"          # the engine's two ShadowKV steps
FUSED, FUSED64, TORCH = "fused", "fused-int64", "torch"        # the engine's three chunk-cache fills
VERSIONS = ("fit", "engine-versions.json")                      # under the data root: the runs' steps and fills


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


@lru_cache(maxsize=None)
def _versions() -> dict:
    path = traces_dir(*VERSIONS)
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DDBenchError(f"{path}: cannot read the engine runs' versions ({e})") from None
    return runs


def engine_version(git_sha, meta: dict | None = None) -> dict:
    """Which ShadowKV step and chunk-cache fill an engine run ran ({"shadowkv_step", "cache_fill"}): its
    meta.json's `engine` field, else traces/fit/engine-versions.json by its git sha (the module doc). A
    DDBenchError where the sha is missing or recorded nowhere."""
    own = (meta or {}).get("engine")
    if isinstance(own, dict) and {"shadowkv_step", "cache_fill"} <= set(own):
        return own
    sha = str(git_sha or "").strip().split("+")[0]
    if not sha or sha == "nan":
        raise DDBenchError("the engine run has no git sha and its meta.json no engine field: cannot tell which"
                           " ShadowKV step and chunk-cache fill it ran")
    for key, v in _versions().items():
        if len(sha) >= 7 and sha.startswith(key):
            return v
    raise DDBenchError(f"engine run of commit {sha[:10]}: not in {'/'.join(VERSIONS)} and its meta.json has no"
                       " engine field: cannot tell which ShadowKV step and chunk-cache fill it ran")


def shadowkv_step(git_sha, meta: dict | None = None) -> str:
    """Which ShadowKV step an engine run ran: IN_PLACE or COPY_REGATHER (engine_version)."""
    return engine_version(git_sha, meta)["shadowkv_step"]


def cache_fill_kind(git_sha, meta: dict | None = None) -> str:
    """Which chunk-cache fill an engine run ran: FUSED, FUSED64 or TORCH (engine_version)."""
    return engine_version(git_sha, meta)["cache_fill"]


def row_git_sha(r, meta: dict | None = None):
    """The engine row's git sha (its git_sha column, else its run's meta.json provenance)."""
    v = getattr(r, "git_sha", None)
    if isinstance(v, str) and v:
        return v
    return ((meta or {}).get("provenance") or {}).get("git_sha")


def legacy_reuse_fetch(plan, cm, miss: float, kv_bits: int = 16):
    """The plan of a ShadowKV step as an older engine ran it (COPY_REGATHER, copy-then-regather; the
    module doc), from the user's plan of it (`plan`: step_layers at reuse rate 1 - `miss` on every layer,
    as replay_plan builds it): the key rebuild of every selected slot of every low-rank layer (the
    in-place plan rebuilds the misses' only), and where the plan moves bytes, per layer on the compute
    stream before that rebuild (ur_serial) the copy of the previous selection into a spare buffer, the
    reuse plan and one 32-program gather over every slot (ur_min_s: CostModel.reuse_fetch_s at the miss
    share, fitted to the bundle's reuse_fetch records), its misses at the bundle's gather rate (not the
    in-place slot gather's). Unchanged for designs without reuse. A term of that engine, never the
    user's plan."""
    from ddbench.core.memory import Workload, kv_piece_bytes
    from ddbench.sim.costmodel import ENGINE_REUSE_IN_FLIGHT, ENGINE_REUSE_PROGRAMS
    d = plan.design
    if not (d.reuse and d.prefetch == "none" and not d.kv_on_gpu):
        return plan
    m, L = cm.model, plan.layers
    w = Workload(context=max(1, int(round(plan.context))), batch=plan.batch, kv_bits=kv_bits)
    reb = cm.rebuild_s(plan.batch, w.budget, w.rank, triton=d.kernels == "triton") if plan.lowrank else 0.0
    # the in-place plan rebuilds the misses' keys (rebuild x miss share); the old step rebuilt every slot's
    mid = [x + (plan.passes * reb * (1.0 - miss) if i in plan.lowrank else 0.0) for i, x in enumerate(plan.mid)]
    if plan.rates is None:                 # compute only: nothing on the link, no fetch (the engine skips it)
        return replace(plan, mid=mid)
    piece = kv_piece_bytes(m, w)
    cbs = [(1 if (d.fetch == "values" or i in plan.lowrank) else 2) * piece for i in range(L)]
    rates = {cb: cm.link_rates(d.gather, cb, fp8=kv_bits != 16) for cb in set(cbs)}
    ur_w = [rates[cbs[i]].h2d_t0_s + b / (rates[cbs[i]].h2d_gbps * 1e9) if b > 0 else 0.0
            for i, b in enumerate(plan.ur_bytes)]
    slots = plan.batch * m.num_kv_heads * (w.budget // w.chunk)
    ur_min = [plan.passes * cm.reuse_fetch_s(slots, cbs[i], ENGINE_REUSE_PROGRAMS, ENGINE_REUSE_IN_FLIGHT, miss)
              if plan.ur_bytes[i] > 0 else 0.0 for i in range(L)]
    return replace(plan, mid=mid, ur_work=ur_w, rates=rates[cbs[0]], ur_min_s=ur_min, ur_serial=True)


def effective_miss(rate: float, budget: int, chunk: int) -> float:
    """The engine's forced miss rate: round(rate * k) of k = budget / chunk chunks per (request, head)."""
    k = budget // chunk
    return round(rate * k) / k


def engine_cache_rates(r, model: str):
    """A chunk-cache design's rates at an engine point: the chunks its cache really moved per step (the
    row's prefetch and urgent bytes, its forced churn and misses through its own LRU cache) over the
    budget's; the replay takes the workload's rates from the engine as it takes the forced miss rate."""
    from ddbench.core.rates import forced
    from ddbench.core.catalog import get_model
    from ddbench.core.memory import Workload, kv_piece_bytes
    m, w = get_model(model), Workload(context=int(r.context), kv_bits=row_kv_bits(r))
    full = int(r.batch) * m.num_layers * m.num_kv_heads * (w.budget // w.chunk) * 2 * kv_piece_bytes(m, w)
    pf, ur = float(r.prefetch_mib) * MIB / full, float(r.urgent_mib) * MIB / full
    return forced(min(pf, 1.0), min(ur, 1.0), m.num_layers,
                  f"the engine's moved chunks: prefetched {pf:.3f}, urgent {ur:.3f} of the budget per step")


def replay_plan(design, context: int, batch: int, miss: float, transfers: bool, cm=None, model: str = MODEL,
                cache=None):
    """The simulator's plan of one engine point: exactly the user's (`ddbench simulate --design design
    --context context --batch batch --hit-rate 1-miss`: step_layers at hit = reuse = 1 - miss on every
    layer), with the link work (and ShadowKV's fetch) removed where the engine ran compute only. No
    harness term (with_harness adds it). design: a registry design's name, or an EnginePoint
    (ddbench.core.enginepoint: its chunk-cache capacity and the bits of the host KV and the cache too)."""
    from ddbench.core.catalog import get_model
    from ddbench.core.enginepoint import EnginePoint
    from ddbench.core.memory import Workload
    from ddbench.core.designs import get_design
    from ddbench.sim.steplayers import step_layers
    from ddbench.sim.factory import cost_model
    design, cache_tokens, kv_bits, cache_bits = design if isinstance(design, EnginePoint) else EnginePoint(design)
    m = get_model(model)
    cm = cm or cost_model(model, GPU, LINK)
    hit = [1.0 - miss] * m.num_layers
    w = Workload(context=context, batch=batch, kv_bits=kv_bits, cache_bits=cache_bits,
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
    from ddbench.sim.timeline import run_timeline
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


def row_cache_bits(r) -> int:
    """The engine row's cache_bits (rows before the fp8 GPU cache have none: 16)."""
    v = getattr(r, "cache_bits", None)
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
