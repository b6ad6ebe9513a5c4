"""`ddbench plan`'s fleet choices: tensor parallelism's notes and --tp auto, where prefill runs by default,
the deployable flags and the trained-context warning.

    tp_view(r)                  what each rank holds, the all-reduce's cost and source (plan, simulate)
    auto_tp_serving(args, run)  --tp auto with an SLO: every TP that fits, the one needing fewest GPUs kept
    prefill_default(args, run)  no --prefill: both placements searched, the one needing fewer GPUs kept, and
                                a first-lines note where prefill on the decode GPU is what binds
"""

from __future__ import annotations

import argparse
import math

from ddbench.core.tp import AUTO, describe
from ddbench.core.units import fmt_tokens

SAMPLE_BATCHES = (1, 64)        # decode batches at which the all-reduce's cost is shown
BINDS_FACTOR = 2.0              # prefill here binds where it needs this many times the GPUs of prefill elsewhere


def tp_view(r) -> dict:
    """One rank's share and the all-reduce, as short lines and numbers (r: a Resolved)."""
    from ddbench.core.catalog.interconnect import interconnect_of
    if r.tp <= 1:
        return {"tp": 1, "note": "TP 1: one GPU per replica", "allreduce": ""}
    comm = interconnect_of(r.gpu.name)
    m = r.full_model
    per = {b: comm.allreduce_s(b * m.hidden * 2, r.tp, r.link.achievable_gbps) for b in SAMPLE_BATCHES}
    step = {b: 2 * m.num_layers * t for b, t in per.items()}
    shown = ", ".join(f"batch {b}: {per[b] * 1e6:.1f} us each, {step[b] * 1e3:.2f} ms per step" for b in per)
    alone = "" if r.share is not None else " (no host named: the ranks' shared links and host memory not modelled)"
    return {"tp": r.tp, "note": describe(m, r.tp) + "; each fetches its heads' KV over its own link" + alone,
            "allreduce": f"all-reduce (2 per layer) over {comm.name}: {shown}; {comm.provenance}: {comm.source}"
                         + (f" ({comm.caveat})" if comm.caveat else ""),
            "allreduce_s": {str(b): t for b, t in per.items()}, "interconnect": comm.name,
            "provenance": comm.provenance, "source": comm.source}


def context_warning(r) -> list[str]:
    """A warning line where the context exceeds the model's trained context (max_position_embeddings)."""
    ctx = r.max_context or r.workload.context
    trained = r.full_model.max_position
    if ctx <= trained:
        return []
    return [f"warning: context {fmt_tokens(ctx)} is beyond {r.full_model.name}'s trained context"
            f" {fmt_tokens(trained)} (max_position_embeddings)"]


def deploy_for(resolved, host_gb_per_replica: float | None) -> list[str]:
    """Deployable flags of each design (ddbench.planner.deploy), one short line each, duplicates once."""
    from ddbench.planner.deploy import NO_FEATURE, deploy_lines
    out, none = [], []
    for r in resolved:
        w = r.workload if r.max_context is None else r.workload.__class__(**{**vars(r.workload),
                                                                              "context": r.max_context})
        lines = deploy_lines(r.design, r.full_model, r.tp, w, host_gb_per_replica)
        if lines == [NO_FEATURE]:
            none.append(r.design.name)
            continue
        for line in lines:
            line = line.replace("deploy:", f"deploy {r.design.name}:", 1)
            if line not in out:
                out.append(line)
    if none:
        out.append(f"deploy {', '.join(none)}: no vLLM or SGLang feature implements {'it' if len(none) == 1 else 'them'}")
    return out


def _score(out: dict) -> float:
    """Requests/s per GPU of the whole fleet of the design ranked first (0 where none meets the SLO)."""
    from ddbench.commands.plan_answer import per_gpu
    first = next((d for d in out["designs"] if d["rank"] == 1), None)
    return per_gpu(first) if first else 0.0


def auto_tp_serving(args, run) -> dict:
    """--tp auto with an SLO: `run(args)` at every TP of the host that fits; the one with the most req/s per GPU
    (so the fewest GPUs for a target) kept, the others listed."""
    from ddbench.core.errors import DDBenchError
    from ddbench.planner.scenario_args import tp_candidates, tp_host
    tried, best = [], None
    for tp in tp_candidates(args, args.host):
        ns = argparse.Namespace(**{**vars(args), "tp": tp})
        try:
            out = run(ns)
        except DDBenchError as exc:
            if tp == 1 or "does not fit" in str(exc) or "leaves no room" in str(exc):
                tried.append({"tp": tp, "req_per_s_per_gpu": 0.0, "why": str(exc)})
                continue
            raise
        tried.append({"tp": tp, "req_per_s_per_gpu": _score(out)})
        if best is None or _score(out) > _score(best):
            best = out
    if best is None:
        raise DDBenchError(f"--tp auto: no TP up to {tried[-1]['tp']} serves {args.model} on {args.gpu}")
    best["tp_auto"] = tried
    kept = best["tp"]["tp"]
    host = args.host or (tp_host(args.gpu, kept) if kept > 1 else None)
    best.setdefault("notes", []).append("--tp auto: " + ", ".join(
        f"TP {t['tp']} {t['req_per_s_per_gpu']:.3g} req/s/GPU" for t in tried) + f"; TP {kept} kept"
        + (f" (host {host})" if host else ""))
    return best


def prefill_default(args, run) -> dict:
    """No --prefill given: search with prefill on the decode GPU and on separate GPUs; keep the one needing
    fewer GPUs per req/s, and say in the first lines where prefill on the decode GPU binds."""
    here = run(argparse.Namespace(**{**vars(args), "prefill": "here"}))
    away = run(argparse.Namespace(**{**vars(args), "prefill": "elsewhere"}))
    h, a = _score(here), _score(away)
    keep, other = (away, here) if a > h else (here, away)
    if a > h * BINDS_FACTOR:
        ratio = a / h if h > 0 else math.inf
        line = (f"prefill on the decode GPU binds: {h:.3g} req/s/GPU there, {a:.3g} on separate GPUs"
                f" ({'over 1000' if ratio > 1000 else f'{ratio:.0f}'}x): using --prefill elsewhere")
    elif a == h == 0:
        line = "neither placement of prefill (on the decode GPU, on separate GPUs) meets the SLO"
    elif a > h:
        line = f"prefill on separate GPUs: {a:.3g} req/s per GPU, against {h:.3g} on the decode GPU (--prefill here)"
    else:
        line = f"prefill on the decode GPU: {h:.3g} req/s per GPU, against {a:.3g} on separate GPUs (--prefill elsewhere)"
    keep["prefill_choice"] = {"line": line, "here_req_per_s_per_gpu": h, "elsewhere_req_per_s_per_gpu": a,
                              "kept": keep["prefill"]}
    keep["prefill_other"] = {"prefill": other["prefill"], "designs": [
        {k: d.get(k) for k in ("system", "status", "max_rate_req_per_s", "rate_per_gpu", "tp")}
        for d in other["designs"]]}
    return keep


def tp_is_auto(args) -> bool:
    return getattr(args, "tp", None) == AUTO
