"""The rates under each selection index (issue 47), with 95 % intervals over samples: the `by_index` section of
the summary of `ddbench profile --layer-accuracy --indexes flat,fp8,...`.

    c = Collector()
    c.add_overlaps((index, context, task, budget), sample, m)     m: metrics.overlaps of one run, [steps, G, H]
    c.add_cache((index, context, task, budget, prediction, policy, capacity), sample, counts, k)
    c.summary(indexes, flat_task_accuracy, index_tasks) -> {"note", "rates", "cache", "tasks", "task_rows",
                                                             "outside_flat"}

Every index selects over the same prefill, landmarks and captured queries (ddbench/profile/selection.py
select_by): the true selection (the output token's query) and the prediction (the speculative token's) are
both that index's top-k, so hit, reuse, union and the cache's counts are the design's rates under that index.
An item is one sample (one question of a prompt: with --questions, the questions of one haystack are separate
samples that share it, so the items are not independent and the interval is a spread, not a test): the mean
over its counted steps, global layers and KV heads of the basis runs (init t2 with temperature > 0, else every
run, as the cache replay). Interval: mean +- t(0.975, n-1) sd / sqrt(n) (Student, n samples; its low end cut at
0). Cache rates per sample: prefetched (churn), urgent and moved chunks per step over k (coverage = 1 - urgent),
urgent_share = urgent / moved.
Task rates: the sparse method's answers under each index (hfattention.SparsePlan.index), Wilson 95 %.
`outside_flat`: a setting whose mean (rate) lies outside flat's interval at the same context, task, budget
(and cache setting); listed in `outside_flat`, never hidden.
"""

from __future__ import annotations

import math
from collections import defaultdict

OVERLAPS = ("hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share")
CACHE = ("prefetched_per_budget", "urgent_per_budget", "moved_per_budget", "urgent_share")   # coverage: 1 - urgent
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)         # Student's t 97.5 % quantile, 1..30 degrees of freedom


def t975(df: int) -> float:
    return T975[df - 1] if df <= len(T975) else 1.96 + 2.4 / df     # within 0.01 of the quantile beyond 30


def interval(xs: list) -> tuple:
    """(mean, low, high, n): Student's 95 % interval of the mean of the items `xs` (one item: no spread)."""
    n = len(xs)
    m = sum(xs) / n
    if n < 2:
        return m, m, m, n
    h = t975(n - 1) * math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n)
    return m, m - h, m + h, n


class Collector:
    def __init__(self):
        self.ov = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))       # (key, metric) -> sample -> [sum, n]
        self.cache = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))   # key -> sample -> [pre, urg, n*k]

    def add_overlaps(self, key: tuple, sample: int, m: dict) -> None:
        for name in OVERLAPS:
            acc = self.ov[(key, name)][sample]
            acc[0] += float(m[name].sum())
            acc[1] += m[name].numel()

    def add_cache(self, key: tuple, sample: int, counts: dict, k: int) -> None:
        acc = self.cache[key][sample]
        acc[0] += float(counts["prefetched"].sum())
        acc[1] += float(counts["urgent"].sum())
        acc[2] += counts["urgent"].numel() * k

    def _overlap_rows(self) -> list:
        out = []
        for ((ix, c, task, b), name), per in self.ov.items():
            out.append(_row(dict(index=ix, context_tokens=c, task=task, budget_tokens=b, metric=name),
                            [s / n for s, n in per.values()]))
        return out

    def _cache_rows(self) -> list:
        out = []
        for (ix, c, task, b, how, pol, cap), per in self.cache.items():
            where = dict(index=ix, context_tokens=c, task=task, budget_tokens=b, prediction=how, policy=pol,
                         capacity=cap)
            rates = [_cache_rates(*v) for v in per.values()]
            out += [_row({**where, "metric": name}, [r[name] for r in rates]) for name in CACHE]
        return out

    def summary(self, indexes: tuple, flat_tasks: list, index_tasks: dict) -> dict:
        pos, outside = {n: i for i, n in enumerate(indexes)}, []
        rates, cache = _flag(self._overlap_rows(), pos, outside), _flag(self._cache_rows(), pos, outside)
        task_rows = _task_rows(flat_tasks, index_tasks)
        tasks = _flag([{k: v for k, v in r.items() if k not in ("method", "correct", "accuracy", "low", "high",
                                                                 "rank")}
                       | {"metric": "task_rate", "mean": r["accuracy"], "low": r["low"], "high": r["high"],
                          "correct": r["correct"]} for r in task_rows], pos, outside)
        return {"note": __doc__.split("\n\n")[1].replace("\n", " "), "rates": rates, "cache": cache,
                "tasks": tasks, "task_rows": [r for r in task_rows if r["index"] != "flat"], "outside_flat": outside}


def _cache_rates(pre: float, urg: float, nk: int) -> dict:
    p, u = pre / nk, urg / nk
    return {"prefetched_per_budget": p, "urgent_per_budget": u, "moved_per_budget": p + u,
            "urgent_share": u / (p + u) if p + u > 0 else 0.0}


def _row(where: dict, xs: list) -> dict:
    m, lo, hi, n = interval(xs)
    return {**where, "mean": round(m, 4), "low": round(max(0.0, lo), 4), "high": round(hi, 4), "n": n}   # rates >= 0


def _flag(rows: list, pos: dict, outside: list) -> list:
    """Rows sorted (context, task, budget, cache setting, metric, index order), each with outside_flat: its mean
    outside flat's interval of the same setting (None for flat, or where flat was not measured); every such
    row described in `outside`."""
    def setting(r):
        return tuple((k, r[k]) for k in r if k not in ("index", "mean", "low", "high", "n", "total", "correct",
                                                        "outside_flat"))
    flat = {setting(r): r for r in rows if r["index"] == "flat"}
    rows = sorted(rows, key=lambda r: (tuple(str(v) for _, v in setting(r)), pos.get(r["index"], len(pos))))
    for r in rows:
        f = flat.get(setting(r))
        r["outside_flat"] = None if r["index"] == "flat" or f is None else not f["low"] <= r["mean"] <= f["high"]
        if r["outside_flat"]:
            cache = f" {r['prediction']} {r['policy']} capacity {r['capacity']:g}" if "policy" in r else ""
            outside.append(f"{r['index']}: {r['metric']} {r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}] at"
                           f" {r['context_tokens']} tokens, {r['task']}, budget {r['budget_tokens']}{cache};"
                           f" flat {f['mean']:.3f} [{f['low']:.3f}, {f['high']:.3f}]")
    return rows


def _task_rows(flat_tasks: list, index_tasks: dict) -> list:
    """The sparse task rates per index: flat's from the summary's task_accuracy, the others' counted here."""
    from ddbench.profile.quality import wilson
    rows = [{**a, "index": "flat"} for a in flat_tasks if a["method"] == "sparse"]
    for (ix, c, task, b), (ok, total) in sorted(index_tasks.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
        lo, hi = wilson(ok, total)
        rows.append({"context_tokens": c, "task": task, "budget_tokens": b, "method": "sparse", "correct": ok,
                     "total": total, "accuracy": round(ok / total, 4), "low": round(lo, 4), "high": round(hi, 4),
                     "index": ix})
    return rows
