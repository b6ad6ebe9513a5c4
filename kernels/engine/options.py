"""The engine sweep's options: as given (SweepOptions, one field per flag of `python -m ddbench.kernels.engine.sweep`,
which `ddbench bench engine` fills from its own flags), and as checked (Checked: the models, the cap,
the paper phase's points, labels and bounds). Everything here is checked without a GPU: bad input
exits 2 anywhere, before any GPU work.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from ddbench.core import defaults as D
from ddbench.core.catalog import get_model
from ddbench.core.designs import DESIGNS as SYSTEMS
from ddbench.core.errors import DDBenchError
from ddbench.core.index import index_name
from ddbench.core.memory import selects
from ddbench.core.flags import ENGINE_KV_BITS_HELP, OneLineParser
from ddbench.kernels.engine import paper as paper_phase
from ddbench.kernels.engine.phases import DEFAULT_MODEL, PAPER, PHASES
from ddbench.kernels.engine.points import Label, PointTiming, design_spec, make_config


@dataclass(frozen=True)
class SweepOptions:
    """The sweep's options as given (build_parser's flags; their help says what each means)."""
    quick: bool = False
    reps: int = 3
    host_gib: float = 16.0
    budget_s: float = 420.0
    replays: int = 5
    out: str | None = None
    resume: bool = False
    force: bool = False
    profile: bool = False
    point: str | None = None
    miss: float | None = None
    model: str = DEFAULT_MODEL
    gpu_mem_cap: str | None = None
    contexts: str | None = None
    paper_points: str | None = None
    designs: str | None = None
    cache_tokens: str | None = None
    kv_bits: str = "16"
    cache_bits: str = "16"
    churn: float | None = None
    repeats: int = 1
    max_batch: int | None = None
    budget: int | None = None
    chunk: int | None = None
    no_transfers: bool = False
    phases: str = ",".join(PHASES)
    seed: int = 0
    folder: str | None = None
    index: str = "flat"


@dataclass(frozen=True)
class Checked(SweepOptions):
    """The options checked (check_args): every given field, and what they resolve to."""
    model_spec: object = None             # the ModelSpec of --model
    cap: int | None = None                # --gpu-mem-cap in bytes (None: this GPU's own memory)
    cap_label: str = "none"
    cap_models: tuple = ()                # every model the run builds (the cap is checked against each)
    paper_contexts: tuple = ()
    paper_points: tuple = ()              # (ModelSpec, context, fixed batch or None), in run order
    paper_designs: tuple = ()
    paper_cache_tokens: tuple = ()
    paper_kv_bits: tuple = ()
    paper_cache_bits: tuple = ()
    paper_cache_rates: object = None      # (context, tokens, prediction) -> (urgent, churn, note), or None
    paper_max_batch: int = 0
    paper_miss: float | None = None       # --miss forced on every design; None: each design's matched rates


def build_parser(description=None):
    ap = OneLineParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of every mechanism point (>= 3 for ratios); in"
                                                        " the paper phase, the timed replays of every point")
    ap.add_argument("--host-gib", type=float, default=16.0,
                    help="pinned host KV buffer (aliased across layers, then requests, where a point needs more)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this many seconds")
    ap.add_argument("--replays", type=int, default=5, help="timed graph replays (2 steps each) per point")
    ap.add_argument("--out", help="output root (default: the data root's engine/)")
    ap.add_argument("--resume", action="store_true", help="skip points already in <out>/<gpu>/rows.jsonl")
    ap.add_argument("--force", action="store_true", help="replace an earlier sweep in the folder (ddbench's own files"
                                                         " only)")
    ap.add_argument("--profile", action="store_true", help="also write a one-step kernel timeline (torch.profiler)")
    ap.add_argument("--point", help="one point only: DESIGN:CONTEXT:BATCH (checked, then run and printed)")
    ap.add_argument("--miss", type=float, help="forced miss rate (default: the design's matched, measured rates,"
                                               " ddbench.core.rates: --point and the paper phase)")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="a catalog model (llama-3-8b, qwen2.5-14b, qwen2.5-32b, ...) or a path to a config.json")
    ap.add_argument("--gpu-mem-cap", help="emulate a GPU of this many GB (1e9 bytes) or a catalog GPU's memory"
                                          " (h100-80gb); default: this GPU's own")
    ap.add_argument("--contexts", help="paper phase: comma-separated contexts (default 128k; --quick 32k)")
    ap.add_argument("--paper-points", help="paper phase: ordered MODEL:CONTEXT pairs, comma-separated, in one process"
                                           " (qwen2.5-32b:128k,llama-3-8b:128k); default --model at each of --contexts")
    ap.add_argument("--designs", help="paper phase: comma-separated designs to search (default"
                                      " dualdecoder,shadowkv,specache,full-kv; dualdecoder-cache too)")
    ap.add_argument("--cache-tokens", help="paper phase: comma-separated chunk-cache capacities in tokens per (layer, KV"
                                           " head), each searched for dualdecoder-cache (default the Workload's)")
    ap.add_argument("--kv-bits", default="16", help=ENGINE_KV_BITS_HELP)
    ap.add_argument("--cache-bits", default="16", help="paper phase: 16 and/or 8 (comma-separated): with 8 (and 8 in"
                                                       " --kv-bits), each chunk-cache design with an fp8 host KV once"
                                                       " more with an fp8 GPU chunk cache (label +fp8cache)")
    ap.add_argument("--churn", type=float, help="dualdecoder-cache: forced share of each step's prediction new"
                                                " against the last (with --miss: the urgent share), instead of the"
                                                " profile's measured rates")
    ap.add_argument("--repeats", type=int, default=1,
                    help="paper phase: build and measure each design's largest (or fixed) batch this many times, each a"
                         " new engine (seed + rep): min / median / max over independent builds")
    ap.add_argument("--max-batch", type=int, help=f"paper phase: the largest batch searched (default"
                                                  f" {paper_phase.MAX_BATCH}; --quick {paper_phase.QUICK['max_batch']})")
    ap.add_argument("--budget", type=int, help="sparse budget in tokens (default: the core Workload's)")
    ap.add_argument("--chunk", type=int, help="tokens per chunk (default: the core Workload's)")
    ap.add_argument("--no-transfers", action="store_true")
    ap.add_argument("--phases", default=",".join(PHASES),
                    help="comma-separated phases to run (floor, mechanism, validation, reuse-fetch; default"
                         " these; paper only when named)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the weights, the host KV values and the forced-miss draws (default 0)")
    ap.add_argument("--index", default="flat", help="--point: the landmark designs' selection index (flat, fp8, int4,"
                                                    " two-level:G[,M[,COARSE[,FINE]]]; ddbench/core/index.py)")
    ap.add_argument("--folder", help="output folder under --out (default the GPU's name for all phases, else"
                                     " <gpu>-<phases>, e.g. h200-validation)")
    return ap


# ------------------------------------------------------------------ one point (--point)

def parse_point(text):
    parts = text.split(":")
    if len(parts) != 3:
        raise DDBenchError(f"--point must be DESIGN:CONTEXT:BATCH, got {text!r}")
    d, c, b = parts
    design_spec(d)
    try:
        c, b = int(c), int(b)
    except ValueError:
        raise DDBenchError(f"--point context and batch must be integers, got {text!r}") from None
    return d, c, b


def point_rates(model, design, ctx, cache_tokens, a, note: bool = False):
    """(miss, churn) of a --point: --miss (and --churn) where given, else the design's matched rates
    (kernels/engine/paper.matched_rates, ddbench.core.rates); with `note`, (miss, churn, the rates' line)."""
    if a.miss is not None:
        out = a.miss, a.churn, f"forced by --miss {a.miss:g}" + ("" if a.churn is None else f" --churn {a.churn:g}")
    else:
        from ddbench.kernels.engine.paper import matched_rates
        out = matched_rates(model, a.budget)(ctx, design, cache_tokens)
    return out if note else out[:2]


def check_point(model, design, ctx, batch, a):
    """The --point's config; a label design[@tokens][+fp8|+fp8cache] sets the cache capacity, the fp8 host KV
    and the fp8 GPU chunk cache."""
    label = Label.parse(design)
    chunk_cache = design_spec(design).chunk_cache
    ct = (label.cache_tokens or a.paper_cache_tokens[0]) if chunk_cache else None
    from ddbench.core.memory import check_cache_bits, keeps_kv_on_host
    if label.kv_bits == 8 and not keeps_kv_on_host(design_spec(design)):
        raise DDBenchError(f"--point {design}: fp8 applies to designs that keep their KV on the host")
    miss, churn = point_rates(model, label.design, ctx, ct, a)
    cfg = make_config(ctx, batch, PointTiming(miss, not a.no_transfers), budget=a.budget, chunk=a.chunk,
                      cache_tokens=ct, churn_rate=churn if chunk_cache else None, kv_bits=label.kv_bits,
                      cache_bits=label.cache_bits, index=index_name(a.index))
    cfg.validate(model)
    check_cache_bits(design_spec(design), cfg.workload)
    if ct is not None and ct < cfg.budget:
        raise DDBenchError(f"--cache-tokens {ct} is smaller than the budget ({cfg.budget} tokens)")
    return cfg


# ------------------------------------------------------------------ the paper phase's points

def parse_contexts(text, model):
    """--contexts '64k,128k' -> (65536, 131072), each checked against the model (one-line errors)."""
    from ddbench.core.units import parse_tokens
    items = [x.strip() for x in str(text).split(",") if x.strip()]
    if not items:
        raise DDBenchError(f"--contexts takes comma-separated contexts (128k,256k), got {text!r}")
    out = tuple(parse_tokens(x, "--contexts") for x in items)
    for c in out:
        make_config(c, 1).validate(model)
    return out


def parse_paper_points(text, cap):
    """--paper-points 'qwen2.5-32b:128k,llama-3-8b:128k:12' -> [(ModelSpec, 131072, None), (.., 131072, 12)]
    in that order (a third field: that batch only, no search); every model checked against the cap and
    every context against its model; one model spec per name."""
    specs, out = {}, []
    for item in (x.strip() for x in str(text).split(",")):
        parts = item.split(":")
        batch = None
        if len(parts) >= 3:
            try:
                batch = int(parts[-1])
            except ValueError:
                batch = None
            else:
                parts = parts[:-1]
                if batch < 1:
                    raise DDBenchError(f"--paper-points: the batch of {item!r} must be >= 1")
        name, ctx = ":".join(parts[:-1]), parts[-1] if len(parts) > 1 else ""
        if not name or not ctx:
            raise DDBenchError(f"--paper-points takes MODEL:CONTEXT[:BATCH] items (qwen2.5-32b:128k), got {item!r}")
        if name not in specs:
            specs[name] = get_model(name)
            paper_phase.check_cap(cap, specs[name])
        out.append((specs[name], parse_contexts(ctx, specs[name])[0], batch))
    return out


def _paper_designs(text):
    if not text:
        return paper_phase.DESIGNS
    names = [x.strip() for x in text.split(",")]
    for n in names:
        s = SYSTEMS.get(n)    # GPU-gather designs that keep their KV on the GPU or select on it (not Figure 2's bound)
        if s is None or s.gather != "gpu" or not (s.kv_on_gpu or selects(s)):
            raise DDBenchError(f"--designs: {n!r} is not a design the paper phase runs")
    return tuple(names)


def _cache_tokens(text, model, budget):
    """--cache-tokens '4096,8192' -> (4096, 8192), each valid for the model and not below the budget."""
    if not text:
        return (D.CACHE_TOKENS,)
    from ddbench.core.units import parse_tokens
    out = tuple(parse_tokens(x.strip(), "--cache-tokens") for x in text.split(","))
    for t in out:
        make_config(paper_phase.DEFAULT_CONTEXTS[0], 1, cache_tokens=t).validate(model)
        if t < (budget or D.BUDGET):
            raise DDBenchError(f"--cache-tokens {t} is smaller than the budget ({budget or D.BUDGET} tokens)")
    return out


def _kv_bits(text, flag="--kv-bits"):
    try:
        bits = tuple(int(x) for x in str(text).split(","))
    except ValueError:
        bits = ()
    if not bits or any(b not in (8, 16) for b in bits):
        raise DDBenchError(f"{flag} takes 16 and/or 8 (comma-separated), got {text!r}")
    return bits


def _cache_bits(text, kv_bits):
    bits = _kv_bits(text, "--cache-bits")
    if 8 in bits and 8 not in kv_bits:
        raise DDBenchError("--cache-bits 8 (an fp8 GPU chunk cache) needs 8 in --kv-bits: its slots are the fp8 host's"
                           " pieces")
    return bits


def _forced_cache_rates(a):
    """--churn (with --miss): the chunk-cache designs' forced rates instead of the profile's."""
    if a.churn is not None and not 0.0 <= a.churn <= 1.0:
        raise DDBenchError(f"--churn must be within 0..1, got {a.churn}")
    if a.churn is not None and a.miss is None:
        raise DDBenchError("--churn needs --miss (the urgent share beside it)")
    if a.churn is None:
        return None
    return lambda ctx, ct, prediction: (a.miss, None if prediction == "none" else a.churn,
                                        f"forced by --miss {a.miss:g} --churn {a.churn:g} (not the profile's)")


# ------------------------------------------------------------------ every option

def check_args(a: SweepOptions, phases=()) -> Checked:
    """Everything checkable without a GPU (bad input exits 2 anywhere): the models, the cap against the
    weights of each model the run uses (cap_models), the paper phase's points and bounds."""
    model = get_model(a.model)
    cap, cap_label = paper_phase.parse_cap(a.gpu_mem_cap)
    if a.reps < 1 or a.replays < 1:
        raise DDBenchError("--reps and --replays must be >= 1")
    if not a.host_gib > 0 or not a.budget_s > 0:
        raise DDBenchError("--host-gib and --budget-s must be positive")
    q = paper_phase.QUICK if a.quick else {}
    contexts = parse_contexts(a.contexts, model) if a.contexts else q.get("contexts", paper_phase.DEFAULT_CONTEXTS)
    points = parse_paper_points(a.paper_points, cap) if a.paper_points else [(model, c, None) for c in contexts]
    if a.repeats < 1:
        raise DDBenchError(f"--repeats must be >= 1, got {a.repeats}")
    if index_name(a.index) != "flat" and not a.point:
        raise DDBenchError("--index applies to one --point run only (the sweep's phases run the flat index)")
    designs = _paper_designs(a.designs)
    cache_tokens = _cache_tokens(a.cache_tokens, model, a.budget)
    kv_bits = _kv_bits(a.kv_bits)
    cache_bits = _cache_bits(a.cache_bits, kv_bits)
    rates = _forced_cache_rates(a)
    used = [m for m, _, _ in points] if PAPER in phases else []
    if set(phases) - {PAPER} or not used:
        used = [model] + used
    cap_models = tuple({m.name: m for m in used}.values())
    for m in cap_models:
        paper_phase.check_cap(cap, m)
    max_batch = a.max_batch if a.max_batch is not None else q.get("max_batch", paper_phase.MAX_BATCH)
    if max_batch < 1:
        raise DDBenchError(f"--max-batch must be >= 1, got {a.max_batch}")
    miss = a.miss      # None: every design at its matched, measured rates (ddbench.core.rates)
    if miss is not None and not 0.0 <= miss <= 1.0:
        raise DDBenchError(f"--miss must be within 0..1, got {a.miss}")
    given = {f.name: getattr(a, f.name) for f in dataclasses.fields(SweepOptions)}
    given.pop("paper_points")
    return Checked(**given, model_spec=model, cap=cap, cap_label=cap_label, cap_models=cap_models,
                   paper_contexts=contexts, paper_points=tuple(points), paper_designs=designs,
                   paper_cache_tokens=cache_tokens, paper_kv_bits=kv_bits, paper_cache_bits=cache_bits,
                   paper_cache_rates=rates,
                   paper_max_batch=max_batch, paper_miss=miss)
