"""The decode compute reconciled with the engine: ENGINE_TERMS (sim/fitted.py EngineFit) fitted to the
engine's kernel breakdown (kernels/engine/breakdown.py: kernel time by category of compute-only CUDA-graph
steps) and the bundle's engine section (whole compute-only steps). Run by `python -m ddbench.sim.fit`
(sim/fit/fitfile.py), which writes the result into the fitted-parameters file; the cost model only
loads it. Imports no torch.
"""

from __future__ import annotations


import numpy as np

from ddbench.core.calibration import ENGINE_MODEL, shown_path
from ddbench.core.catalog.gpus import get_gpu
from ddbench.core.catalog.links import get_link
from ddbench.core.catalog.models import get_model
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError
from ddbench.core.memory import Workload
from ddbench.sim.costmodel import CostModel
from ddbench.sim.fitted import ENGINE_TERMS, EngineFit, Fitted
from ddbench.sim.fit.replay import COPY_REGATHER, IN_PLACE, legacy_reuse_fetch, shadowkv_step
from ddbench.sim.steplayers import step_layers


def nonneg_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares x k = y with k >= 0: columns whose coefficient comes out negative are dropped (set
    to 0) one at a time and the rest re-solved (an active set; the categories have 2-5 terms)."""
    keep = [j for j in range(x.shape[1]) if np.any(x[:, j])]
    k = np.zeros(x.shape[1])
    while keep:
        sol = np.linalg.lstsq(x[:, keep], y, rcond=None)[0]
        if (sol >= 0).all():
            k[keep] = sol
            break
        keep.pop(int(np.argmin(sol)))
    return k


def design_of(name: str):
    """The registry's design of an engine point by name ('dualdecoder-single': DualDecoder with one query
    token), None for a design this registry does not know."""
    try:
        return EnginePoint(name).spec()
    except DDBenchError:
        return None


def step_compute(cm: CostModel, design, context: int, batch: int, step: str = IN_PLACE) -> float:
    """The GPU compute of one step of `design` as the cost model prices it now (all hits), on the engine's
    ShadowKV step `step` (sim/fit/replay.py shadowkv_step: COPY_REGATHER rebuilt every selected key,
    legacy_reuse_fetch)."""
    w = Workload(context=context, batch=batch)
    one = [1.0] * cm.model.num_layers
    cache = None
    if design.chunk_cache:       # compute only: the rates move bytes, not compute
        from ddbench.core.rates import forced
        cache = forced(0.0, 0.0, cm.model.num_layers, "compute only")
    plan = step_layers(design, cm.model, cm, w, batch, context, one, one, cache=cache)
    if step == COPY_REGATHER:
        plan = legacy_reuse_fetch(plan, cm, 0.0)
    return plan.compute_s


def fit_bundle(bundle) -> EngineFit | None:
    """The EngineFit of a bundle with an engine breakdown (None without one): fitted on the engine's model
    and the bundle's GPU, priced with the microbenchmark op model and no other fitted term."""
    if not getattr(bundle, "breakdown", None):
        return None
    fitter = CostModel(get_model(ENGINE_MODEL), get_gpu(bundle.gpu), get_link("pcie5"), bundle, reconcile=False,
                       fitted=Fitted(why="being fitted"))
    return fit_engine_terms(fitter, bundle.breakdown)


def fit_engine_terms(cm, breakdown: dict, joint: bool = True) -> EngineFit:
    """Fit ENGINE_TERMS to an engine breakdown (ddbench.core.calibration.load_breakdown) of the cost
    model `cm`'s model (the engine's) and, with `joint`, to the whole compute-only steps of the bundle's
    engine section (its floor phase: every design at more contexts and batches than the breakdown
    profiled; they fix the terms a breakdown's few shapes cannot separate). Each point is priced by
    sim/steplayers.step_layers, the code every command runs, once per term with that term alone set
    to 1: its compute is then the term's feature summed over the step, so the fit and the pricing
    cannot disagree on what a step runs. One least-squares problem, relative (each measured time
    weighted by 1 / itself), no term negative: a row per (breakdown point, category) and a row per
    engine-section step. The design of a point is the registry's by name ('dualdecoder-single':
    DualDecoder with one query token). Each source's ShadowKV step is its engine run's (shadowkv_step of
    the breakdown's and the engine section's git sha: the committed ones ran the copy-then-regather step)."""
    bd_step = shadowkv_step((breakdown.get("provenance") or {}).get("git_sha"))
    bundle = getattr(cm, "bundle", None)
    src = ((bundle.meta.get("sections", {}).get("engine", {}) if bundle is not None else {}).get("source") or {})
    eng_step = shadowkv_step(src.get("git_sha")) if getattr(cm, "engine_tab", {}) else IN_PLACE
    pts = [(f"{p['design']} {p['context'] // 1024}K b{p['batch']}", design_of(p["design"]), p["context"],
            p["batch"], p) for p in breakdown["points"]]
    pts = [x for x in pts if x[1] is not None]
    if not pts:
        raise DDBenchError(f"{breakdown['path']}: no point of a known design")
    steps = []
    for (system, ctx), (bs, ts) in sorted(getattr(cm, "engine_tab", {}).items()):
        if design_of(system) is not None:
            steps += [(f"{system} {ctx // 1024}K b{b}", design_of(system), ctx, b, t) for b, t in zip(bs, ts)]
    cats = list(ENGINE_TERMS)
    offs = np.cumsum([0] + [len(ENGINE_TERMS[c]) for c in cats])
    n_par = int(offs[-1])
    # features: per point and category, the step's sum of each term's feature (unit parameters)
    everything = pts + steps
    step_of = [bd_step] * len(pts) + [eng_step] * len(steps)
    feats = np.zeros((len(everything), len(cats), n_par))
    try:
        for ci, c in enumerate(cats):
            for j in range(len(ENGINE_TERMS[c])):
                unit = {k: np.zeros(len(v)) for k, v in ENGINE_TERMS.items()}
                unit[c][j] = 1.0
                cm.set_engine_terms(unit, raw=True)
                for n, (_, design, ctx, b, _) in enumerate(everything):
                    feats[n, ci, offs[ci] + j] = step_compute(cm, design, ctx, b, step_of[n])
    finally:
        cm.set_engine_terms(None)
    rows, ys, labels = [], [], []
    for n, (label, _, _, _, p) in enumerate(pts):
        for ci, c in enumerate(cats):
            y = p["categories"].get(c, {}).get("ms", 0.0) / 1e3
            if y > 0 and feats[n, ci].any():
                rows.append(feats[n, ci] / y)
                labels.append((n, ci, y))
    if joint:
        for n, (_, _, _, _, t) in enumerate(steps, start=len(pts)):
            rows.append(feats[n].sum(0) / t)
    k = nonneg_lstsq(np.array(rows), np.ones(len(rows)))
    theta = {c: tuple(float(v) for v in k[offs[ci]:offs[ci + 1]]) for ci, c in enumerate(cats)}
    res = [(pts[n][0], cats[ci], float(feats[n, ci] @ k / y - 1)) for n, ci, y in labels]
    step_res = [(label, float(feats[n].sum(0) @ k / (sum(v["ms"] for v in p["categories"].values()) / 1e3) - 1))
                for n, (label, _, _, _, p) in enumerate(pts)]
    floor = [(label, float(feats[n].sum(0) @ k / t - 1))
             for n, (label, _, _, _, t) in enumerate(steps, start=len(pts))]
    src = breakdown.get("provenance", {})
    source = f"{shown_path(breakdown['path'])}, git {src.get('git_sha')} {src.get('date_utc')}"
    return EngineFit(theta, tuple(res), tuple(step_res), tuple(floor), len(pts),
                     (2, Workload(context=1).quant_group), source, bool(joint and steps))
