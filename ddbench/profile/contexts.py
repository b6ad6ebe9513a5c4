"""Rates against context at a fixed budget share: aggregate one-prompt profiles, give 95 % intervals,
fit the trend, and test whether extrapolating it is supported.

    python -m ddbench.profile.contexts ROOT [--out DIR]

ROOT holds one `ddbench profile --layer-accuracy --samples 1 --cache-capacity ...` run per prompt, as
devtools/profile_contexts.sh lays them out: ROOT/<context>/<task>-s<seed>/<model>.{csv,cache.csv}.
A prompt is the unit of the intervals (its steps and KV heads are not independent). Writes into DIR
(default the data root's accuracy/):

`<model>.contexts.csv`, schema 1: one row per (context_tokens, budget_tokens, band, policy, capacity,
metric): mean over prompts, low/high (Student t 95 % interval of the mean over prompts), prompts, questions.
    prompts  run folders, the unit of every interval and fit: with `--questions Q` a run is one haystack
             (one prefill) with Q questions, which share every token before them and are not independent, so
             the haystack, not the question, is the unit
    questions  the questions those prompts measured (prompts x Q); the rates are their mean per prompt
    band     depth band of the layers, 0..BANDS-1 (layer l of L is in band floor(l * BANDS / L)), or "all"
    prediction  speculative (dualdecoder-cache's prefetch) | none (lru-cache) for the cache replay's
             metrics (runs written before the column: speculative); empty for the prediction's rates
    policy   lru | score for the cache replay's metrics; "prediction" for hit_rate, reuse_hit_rate,
             union_hit_rate (capacity empty)
    metric   coverage, urgent_per_budget, prefetched_per_budget (the churn: predicted chunks the cache lacks,
             prefetched per step / k), moved_per_budget (churn + urgent: chunks moved per step / k),
             urgent_share; or the prediction's three rates

`<model>.cache-trend.json`, schema 1: per (share, prediction, policy, capacity, band, metric) in the trend
metrics (a fit without `prediction`, from before it, is speculative),
a power law fitted by least squares over the prompts, metric = exp(log_a + b * log2(context / 1024)) (so
it stays positive where it is extrapolated; `per_doubling` = exp(b), the factor per doubling), with the covariance of (log_a, b),
and two checks of whether it may be extrapolated: `curvature_p` (the p-value of a term in
log2(context) ** 2 in the exponent) and `holdout` (the law fitted without the longest context, against
that context's mean and its interval). `supported` is true where the extra term is not significant
(p >= 0.05) AND the held-out context's mean lies inside the held-out law's 95 % interval for a mean
of that many prompts. ddbench.core.rates reads this file to take every design's rates for the context at
hand (one matched rate set: ShadowKV's miss at capacity 1x without prediction, DualDecoder's at capacity 0).
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys

BANDS = 6
TREND_METRICS = ("urgent_per_budget", "moved_per_budget", "prefetched_per_budget")
CACHE_METRICS = ("coverage", "prefetched_per_budget", "urgent_per_budget", "moved_per_budget", "urgent_share")
PRED_METRICS = ("hit_rate", "reuse_hit_rate", "union_hit_rate")
COLUMNS = ["context_tokens", "budget_tokens", "share", "band", "prediction", "policy", "capacity", "metric", "mean",
           "low", "high", "prompts", "questions"]
CACHE_KEYS = ["prediction", "policy", "capacity"]     # a cache row's cell (prediction: speculative | none)
REF_CONTEXT = 1024          # the fit's x = log2(context / REF_CONTEXT)
ALPHA = 0.05


def _band(layer, layers):
    return int(layer) * BANDS // int(layers)


def _weighted(df, keys, cols):
    """Means of `cols` over the rows of each `keys` group, weighted by n."""
    w = df["n"].astype(float)
    out = df[keys].copy()
    for c in cols:
        out[c] = df[c].astype(float) * w
    out["n"] = w
    g = out.groupby(keys, as_index=False).sum()
    for c in cols:
        g[c] = g[c] / g["n"]
    return g


def load_prompts(root: str):
    """(cache rows, prediction rows): per prompt, band and cell; a prompt = one run folder."""
    import pandas as pd
    from ddbench.core.errors import DDBenchError
    from ddbench.core.traces import accuracy_frame, cache_profile
    cache, pred, model, layers = [], [], None, None
    runs = sorted(glob.glob(os.path.join(root, "*", "*", ".ddbench-manifest.json")))
    if not runs:
        raise DDBenchError(f"{root}: no finished profile runs (<context>/<task>-s<seed>/ with a manifest)")
    for man in runs:
        folder = os.path.dirname(man)
        prompt = os.path.basename(folder)
        csvs = [p for p in glob.glob(os.path.join(folder, "*.cache.csv"))]
        if len(csvs) != 1:
            raise DDBenchError(f"{folder}: expected one <model>.cache.csv, found {len(csvs)}")
        stem = os.path.basename(csvs[0])[: -len(".cache.csv")]
        c = cache_profile(csvs[0])
        p = accuracy_frame(os.path.join(folder, f"{stem}.csv"))
        if model not in (None, stem):
            raise DDBenchError(f"{folder}: profile of {stem}, but earlier runs in {root} are of {model}")
        model, layers = stem, int(p["layers"].iloc[0])
        nq = _questions(os.path.join(folder, f"{stem}.summary.json"))
        for df, sink, cols, keys in ((c, cache, list(CACHE_METRICS), CACHE_KEYS),
                                     (p, pred, list(PRED_METRICS), [])):
            df = df.copy()
            df["band"] = [_band(x, layers) for x in df["layer"]]
            df["prompt"] = prompt
            df["questions"] = nq
            base = ["prompt", "questions", "context_tokens", "budget_tokens"] + keys
            by_band = _weighted(df, base + ["band"], cols)
            every = _weighted(df, base, cols)
            every["band"] = "all"
            by_band["band"] = by_band["band"].astype(str)
            sink.append(pd.concat([by_band, every], ignore_index=True))
    return pd.concat(cache, ignore_index=True), pd.concat(pred, ignore_index=True), model, layers


def _questions(summary_path: str) -> int:
    """The questions one run measured: --samples prompts x --questions per prompt (1 before shared prefixes)."""
    import json
    try:
        cfg = json.loads(open(summary_path).read())["config"]
    except (OSError, ValueError, KeyError):
        return 1
    return int(cfg.get("samples", 1)) * int(cfg.get("questions", 1))


def t_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): Student t 95 % interval of the mean; the mean alone for one value."""
    import numpy as np
    from scipy import stats
    x = np.asarray(values, dtype=float)
    m = float(x.mean())
    if len(x) < 2:
        return m, m, m
    h = float(stats.t.ppf(1 - ALPHA / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - h, m + h


def cells(cache, pred) -> list[dict]:
    rows = []
    for df, metrics, keys in ((cache, CACHE_METRICS, CACHE_KEYS), (pred, PRED_METRICS, [])):
        for key, g in df.groupby(["context_tokens", "budget_tokens", "band"] + keys, sort=True):
            ctx, budget, band = key[:3]
            for m in metrics:
                mean, lo, hi = t_interval(g[m])
                rows.append({"context_tokens": int(ctx), "budget_tokens": int(budget),
                             "share": round(budget / ctx, 6), "band": band,
                             "prediction": key[3] if keys else "", "policy": key[4] if keys else "prediction",
                             "capacity": key[5] if keys else "",
                             "metric": m, "mean": round(mean, 6), "low": round(lo, 6), "high": round(hi, 6),
                             "prompts": len(g), "questions": int(g["questions"].sum())})
    return rows


def share_of(budget: int, context: int) -> str:
    """The budget share as the fraction it was profiled at, e.g. '1/64' (budgets are rounded to chunks)."""
    return f"1/{round(context / budget)}"


def _power_fit(x, y, degree: int = 1):
    """Least squares of y = exp(c0 + c1 x + ... ) over the prompts (x = log2(context / REF_CONTEXT)):
    a power law in context for degree 1, positive wherever it is extrapolated. (coefficients,
    covariance, residual variance, degrees of freedom)."""
    import numpy as np
    from scipy.optimize import curve_fit
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)

    def f(xx, *c):
        return np.exp(sum(ci * xx ** i for i, ci in enumerate(c)))
    means = {v: max(float(y[x == v].mean()), 1e-4) for v in np.unique(x)}
    xs = np.array(sorted(means))
    p0 = np.polyfit(xs, np.log([means[v] for v in xs]), min(degree, len(xs) - 1))[::-1]
    p0 = list(p0) + [0.0] * (degree + 1 - len(p0))
    if float(np.ptp(y)) == 0.0:           # a constant (e.g. the prediction's whole budget at capacity 0)
        c = np.array([math.log(max(float(y[0]), 1e-12))] + [0.0] * degree)
        return c, np.zeros((degree + 1, degree + 1)), 0.0, max(len(y) - degree - 1, 1)
    c, cov = curve_fit(f, x, y, p0=p0, maxfev=20000)
    resid = y - f(x, *c)
    dof = max(len(y) - degree - 1, 1)
    return c, cov, float(resid @ resid) / dof, dof


def _at(c, cov, x: float) -> tuple[float, float]:
    """(value, standard error of its log) of a degree-1 power fit at x."""
    v = [1.0, x]
    var = sum(v[i] * v[j] * float(cov[i][j]) for i in range(2) for j in range(2))
    return math.exp(float(c[0]) + float(c[1]) * x), math.sqrt(max(var, 0.0))


def fit_trend(g) -> dict:
    """One cell family's power law over the prompts (columns context_tokens, value), with its two checks."""
    import numpy as np
    from scipy import stats
    x = np.log2(g["context_tokens"].to_numpy(dtype=float) / REF_CONTEXT)
    y = g["value"].to_numpy(dtype=float)
    c, cov, s2, dof = _power_fit(x, y)
    out = {"log_a": float(c[0]), "b": float(c[1]), "cov": [[float(v) for v in r] for r in cov],
           "dof": int(dof), "t975": float(stats.t.ppf(1 - ALPHA / 2, dof)), "residual_sd": math.sqrt(s2),
           "prompts": int(len(y)), "contexts": sorted(int(v) for v in set(g["context_tokens"]))}
    out["per_doubling"] = float(math.exp(out["b"]))
    if len(out["contexts"]) < 3 or float(np.ptp(y)) == 0.0:
        out["curvature_p"], out["holdout"], out["supported"] = None, None, len(out["contexts"]) >= 3
        return out
    cq, covq, _, dq = _power_fit(x, y, 2)
    se = math.sqrt(max(float(covq[2][2]), 1e-300))
    out["curvature_p"] = float(2 * stats.t.sf(abs(float(cq[2]) / se), dq))
    top = max(out["contexts"])
    inner = x < math.log2(top / REF_CONTEXT) - 1e-9
    ch, covh, s2h, dofh = _power_fit(x[inner], y[inner])
    held = y[~inner]
    pred, se_log = _at(ch, covh, math.log2(top / REF_CONTEXT))
    half = float(stats.t.ppf(1 - ALPHA / 2, dofh)) * math.sqrt((pred * se_log) ** 2 + s2h / len(held))
    out["holdout"] = {"context_tokens": top, "predicted": pred, "low": pred - half, "high": pred + half,
                      "measured": float(held.mean())}
    out["supported"] = bool(out["curvature_p"] >= ALPHA and pred - half <= held.mean() <= pred + half)
    return out


def trends(cache) -> list[dict]:
    out = []
    cache = cache.copy()
    cache["share"] = [share_of(b, c) for b, c in zip(cache.budget_tokens, cache.context_tokens)]
    for (share, how, policy, cap, band), g in cache.groupby(["share", "prediction", "policy", "capacity", "band"],
                                                            sort=True):
        if g["context_tokens"].nunique() < 2:       # no law from one context
            continue
        for m in TREND_METRICS:
            fit = fit_trend(g.rename(columns={m: "value"})[["context_tokens", "value"]])
            out.append({"share": share, "prediction": how, "policy": policy, "capacity": float(cap), "band": band,
                        "metric": m, **fit})
    return out


def predict(fit: dict, context: int) -> tuple[float, float, float]:
    """(value, low, high) of a trend at `context`: the 95 % interval of the mean rate there."""
    y, se = _at([fit["log_a"], fit["b"]], fit["cov"], math.log2(context / REF_CONTEXT))
    h = fit["t975"] * se
    return y, y * math.exp(-h), y * math.exp(h)


def main(argv=None) -> int:
    from ddbench.core.errors import DDBenchError
    from ddbench.core.flags import OneLineParser
    ap = OneLineParser(prog="python -m ddbench.profile.contexts", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", help="the folder of one-prompt profile runs (devtools/profile_contexts.sh ROOT)")
    ap.add_argument("--out", help="output folder (default: the data root's accuracy/)")
    ap.add_argument("--force", action="store_true", help="replace this model's earlier context files there")
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except DDBenchError as exc:
        print(f"ddbench: error: {exc}", file=sys.stderr)
        return 2


def _run(a) -> int:
    from ddbench.core.io import dumps_json
    from ddbench.core.outputs import output_folder
    from ddbench.core.paths import traces_dir
    from ddbench.core.provenance import command_line, short_sha
    cache, pred, model, layers = load_prompts(a.root)
    rows = cells(cache, pred)
    fits = trends(cache)
    prov = {"model": model, "git_sha": short_sha(), "command": command_line("python -m ddbench.profile.contexts")}
    out = a.out or str(traces_dir("accuracy"))
    from ddbench.core.io import rows_csv
    text = rows_csv(rows, COLUMNS, prov)
    doc = {"schema": 1, "model": model, "layers": layers, "bands": BANDS, "ref_context": REF_CONTEXT,
           "model_form": "metric = exp(log_a + b * log2(context / ref_context)), least squares over prompts",
           "provenance": prov, "prompts_per_context": {str(c): int(n) for c, n in
                                                      pred[pred.band == "all"].groupby("context_tokens")["prompt"]
                                                      .nunique().items()},
           "questions_per_context": {str(c): int(g.drop_duplicates("prompt")["questions"].sum()) for c, g in
                                     pred[pred.band == "all"].groupby("context_tokens")},
           "fits": fits}
    with output_folder(out, command="ddbench profile", shared=True, force=a.force,
                       scope=(f"{model}.contexts.csv", f"{model}.cache-trend.json")) as w:   # this model's only
        w.write_text(f"{model}.contexts.csv", text)
        w.write_text(f"{model}.cache-trend.json", dumps_json(doc) + "\n")
    print(summary(fits))
    print(f"wrote {os.path.join(out, model + '.contexts.csv')} and {model}.cache-trend.json")
    return 0


def summary(fits) -> str:
    lines = ["share  prediction  policy cap  band  metric                x per doubling  curvature p  longest held out: measured"
             " [predicted interval]  supported"]
    for f in fits:
        if f["band"] != "all" or f["capacity"] not in (0.0, 2.0, 4.0):
            continue
        h = f["holdout"]
        ho = f"{h['measured']:.3f} [{h['low']:.3f}, {h['high']:.3f}]" if h else "-"
        cp = f"{f['curvature_p']:.3f}" if f["curvature_p"] is not None else "-"
        lines.append(f"{f['share']:<6} {f['prediction']:<11} {f['policy']:<6} {f['capacity']:<4g} {f['band']:<5} {f['metric']:<21}"
                     f" {f['per_doubling']:.3f}          {cp:<11}  {ho:<44} {f['supported']}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
