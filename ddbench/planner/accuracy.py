"""Accuracy beside speed: what the traces hold about a design's accuracy cost, for the answer that prices it.

    accuracy_cost(resolved) -> {"design", "source", "measured_on", "methods": {...}, "fp8_error", "line", ...}
    assumed_hit_rate(resolved) -> a flag line where the hit rate is the constant of core.defaults.HIT_RATE

A design's rates come from an accuracy profile (the model's traces/accuracy/<model>.csv or --hit-rate CSV)
and, for a chunk-cache design, from the matched rate set (core.rates, possibly another model's profile). The
accuracy cost is read from the traces beside that profile, of the model it was measured on:
- task rates with Wilson 95 % intervals (<model>.tasks.csv, `ddbench profile --tasks`): pooled over the
  tasks and contexts measured, for the method the design stands for (full-kv: dense, exact; shadowkv:
  low-rank keys; the other sparse designs: top-k sparse; with --kv-bits 8 the fp8 rows too), beside the
  dense rate of the same prompts;
- the fp8 attention error (<model>.fp8.summary.json, `ddbench profile --fp8-error`) with --kv-bits 8 (or a
  knob search over fp8): median and p95 of ||o_fp8 - o_bf16|| / ||o_bf16|| over the top-k selection, and
  the bf16-vs-fp32 floor.
A profile without such files says that none is measured. Where the hit rate is the constant (no
profile), the answer says the rate is ASSUMED and that no accuracy is measured for the model.
"""

from __future__ import annotations

import csv
import json
import math
import os

from ddbench.core import defaults as D

METHOD_WORDS = {"dense": "dense (exact)", "sparse": "top-k sparse", "lowrank": "low-rank keys", "fp8": "fp8 KV"}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials."""
    if n <= 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def method_of(design) -> str:
    """The profile method a design's attention stands for."""
    if design.kv_on_gpu:
        return "dense"
    return "lowrank" if design.fetch == "values" else "sparse"


def _stem(path: str) -> str:
    base = os.path.basename(path)
    for tail in (".cache-trend.json", ".cache.csv", ".csv"):
        if base.endswith(tail):
            return base[: -len(tail)]
    return base


def profile_sources(r) -> list[str]:
    """The profiles (paths) a resolved scenario's rates come from: its hit-rate profile, its cache profile."""
    from ddbench.planner.scenario import accuracy_profile_path
    out = []
    dr = r.design_rates if not r.design.kv_on_gpu else None
    if dr is not None and r.scenario.rates is not None and r.scenario.rates.kind != "values":
        out.append(r.scenario.rates.path)
    elif dr is not None and dr.measured:
        from ddbench.core.paths import traces_dir
        out.append(str(traces_dir("accuracy", f"{dr.source}.cache-trend.json")))
    p = accuracy_profile_path(r.scenario, r.model.name)
    if p is not None:
        out.append(p)
    return out


def constant_hit(r) -> bool:
    """Whether the hit rate is core.defaults.HIT_RATE because no profile exists (the paper's assumption)."""
    from ddbench.planner.scenario import accuracy_profile_path
    if r.design.kv_on_gpu or r.design_rates is not None:
        return False
    return r.scenario.hit_rate is None and accuracy_profile_path(r.scenario, r.model.name) is None


def assumed_hit_rate(r) -> str | None:
    if not constant_hit(r) or r.design.kv_on_gpu:
        return None
    return (f"ASSUMED: hit rate {D.HIT_RATE} for {r.model.name} (the paper's average, §4.1; no"
            f" traces/accuracy/{r.model.name}.csv): its speed is not measured, and no accuracy is")


def _task_rows(path: str) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as fh:
        return [row for row in csv.DictReader(line for line in fh if not line.startswith("#"))]


def _pooled(rows: list[dict], method: str) -> dict | None:
    sel = [x for x in rows if x.get("method") == method]
    if not sel:
        return None
    k, n = sum(int(x["correct"]) for x in sel), sum(int(x["total"]) for x in sel)
    lo, hi = wilson(k, n)
    return {"rate": k / n if n else math.nan, "low": lo, "high": hi, "correct": k, "total": n,
            "tasks": sorted({x["task"] for x in sel}), "contexts": sorted({int(x["context_tokens"]) for x in sel}),
            "budgets": sorted({int(x["budget_tokens"]) for x in sel if x.get("budget_tokens")})}


def _fp8_error(path: str) -> dict | None:
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    rows = doc.get("by_selection", [])
    pick = [x for x in rows if x.get("metric") == "fp8_vs_bf16" and x.get("selection") == "topk"] or \
        [x for x in rows if x.get("metric") == "fp8_vs_bf16"]
    floor = [x for x in rows if x.get("metric") == "bf16_vs_fp32" and x.get("selection") == "topk"] or \
        [x for x in rows if x.get("metric") == "bf16_vs_fp32"]
    if not pick:
        return None
    e = pick[0]
    return {"selection": e["selection"], "budget_tokens": e.get("budget_tokens"), "median": e["median"],
            "p95": e["p95"], "floor_median": floor[0]["median"] if floor else None}


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _rate(d: dict) -> str:
    return f"{d['rate']:.2f} [{d['low']:.2f}, {d['high']:.2f}]"


def accuracy_cost(r, fp8: bool | None = None) -> dict:
    """What the traces hold about `r`'s accuracy cost (see the module's text); `fp8`: report the fp8 cost (default:
    the scenario's --kv-bits 8)."""
    name, design = r.design.name, r.design
    fp8 = r.workload.kv_bits == 8 if fp8 is None else fp8
    method = method_of(design)
    out = {"design": name, "method": method, "fp8": fp8, "measured_on": None, "methods": {}, "fp8_error": None}
    if method == "dense" and not fp8:
        out["line"] = f"accuracy of {name}: exact attention over the whole KV (no accuracy cost)"
        return out
    if constant_hit(r) and not design.chunk_cache:
        out["line"] = (f"accuracy of {name}: none measured (its hit rate is the assumed {D.HIT_RATE}; no accuracy"
                       f" profile of {r.model.name})")
        return out
    for src in profile_sources(r):
        stem = _stem(src)
        folder = os.path.dirname(src)
        tasks, fp8_path = os.path.join(folder, f"{stem}.tasks.csv"), os.path.join(folder, f"{stem}.fp8.summary.json")
        if not (os.path.exists(tasks) or (fp8 and os.path.exists(fp8_path))):
            continue
        out["measured_on"], out["source"] = stem, tasks
        if os.path.exists(tasks):
            rows = _task_rows(tasks)
            for m in ("dense", method) + (("fp8",) if fp8 else ()):
                got = _pooled(rows, m)
                if got is not None:
                    out["methods"][m] = got
        if fp8 and os.path.exists(fp8_path):
            out["fp8_error"] = _fp8_error(fp8_path)
        break
    out["line"] = _line(r, out)
    return out


def _line(r, out: dict) -> str:
    name = r.design.name
    if out["measured_on"] is None:
        what = "fp8 error or task rates" if out["fp8"] else "task rates"
        return f"accuracy of {name}: none measured (no {what} beside the profile its rates come from)"
    on = out["measured_on"]
    other = "" if on == r.model.name else f", not on {r.model.name}"
    parts = []
    ms = out["methods"]
    if ms:
        d = next(iter(ms.values()))
        ctx = "/".join(f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in d["contexts"])
        parts.append(", ".join(f"{METHOD_WORDS[m]} {_rate(v)}" for m, v in ms.items())
                     + f" (task rate, Wilson 95 %; {'/'.join(d['tasks'])} at {ctx}, {d['total']} prompts)")
    e = out["fp8_error"]
    if e is not None:
        floor = "" if e["floor_median"] is None else f"; the bf16 floor {_pct(e['floor_median'])}"
        parts.append(f"fp8 attention error median {_pct(e['median'])}, p95 {_pct(e['p95'])} against bf16"
                     f" ({e['selection']}{'' if e['budget_tokens'] is None else ' ' + str(e['budget_tokens'])}{floor})")
    elif out["fp8"]:
        parts.append("fp8 attention error: none measured")
    return f"accuracy of {name} (measured on {on}{other}): " + "; ".join(parts)


def accuracy_lines(resolved, fp8: bool | None = None) -> list[str]:
    """One line per design, then the assumed-hit-rate flag once where any design uses the constant."""
    lines = [accuracy_cost(r, fp8)["line"] for r in resolved]
    flags = {assumed_hit_rate(r) for r in resolved} - {None}
    return lines + sorted(flags)
