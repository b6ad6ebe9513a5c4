"""docs/results.md's fp8 GPU chunk cache block: each design at its largest batch in the two sweeps of
the fp8 work, run again on the current engine (pass 1's 16 splits, the fill's int32 keys;
traces/engine/h200-compare: Llama-3-8B 32K-128K; h200-compare-qwen: Qwen2.5-7B and 14B at 128K), the cache
in bf16, with an fp8 host KV, and with an fp8 host KV and fp8 cache, against our ShadowKV with bf16 and with
fp8 values in the same run; and fp8's accuracy cost beside it."""

from __future__ import annotations

import json
from pathlib import Path

from ddbench.core.designs import SHADOWKV
from ddbench.doctables.common import ROOT, read_trace_json, fmt_context, md_table

SWEEPS = ("h200-compare", "h200-compare-qwen")
CACHE = "dualdecoder-cache@8192"
NAMES = {CACHE: "cache bf16", CACHE + "+fp8": "cache, fp8 host", CACHE + "+fp8cache": "cache, fp8 host + fp8 cache",
         SHADOWKV: "ShadowKV bf16", "shadowkv+fp8": "ShadowKV fp8 values"}
MODELS = ("llama-3-8b", "qwen2.5-7b", "qwen2.5-14b")
ACCURACY = "traces/accuracy/SmolLM2-135M-Instruct.Q4_1.fp8.summary.json"
KERNEL = "traces/kernels/h200-attention-fp8/devcheck-attention-fp8.json"
VALIDATION = "traces/validation/h200-engine-compare-summary.json"


def _points(root: Path) -> dict:
    """(model, context) -> {label: (batch, median, min, max tokens/s over the builds)}."""
    out = {}
    for name in SWEEPS:
        for p in read_trace_json(root / "traces" / "engine" / name / "summary.json")["paper"]:
            b = p["builds_tok_s"]
            out.setdefault((p["model"], p["context"]), {})[p["design"]] = (p["largest_batch"], b["median"], b["min"],
                                                                           b["max"])
    return out


def _simulated(root: Path) -> dict:
    """(model, context, batch, design, kv_bits, cache_bits) -> the simulator's error at that point (median over
    the builds) from `python -m ddbench.sim.validate`'s replay of these sweeps."""
    pp = read_trace_json(root / VALIDATION)["per_point"]
    return {(x["model"], x["context"], x["batch"], x["design"], x["kv_bits"], x["cache_bits"]): x["error_median"]
            for x in pp}



def _floors(root: Path) -> dict:
    """(model, context) -> {label: (batch, HBM floor ms, step ms, design, kv_bits, cache_bits)} of each
    search's largest-batch row."""
    out = {}
    for name in SWEEPS:
        path = root / "traces" / "engine" / name / "rows.jsonl"
        for line in path.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            r = r.get("row", r)
            if r.get("paper_role") == "largest":
                out.setdefault((r["model"], r["context"]), {})[r.get("design_label") or r["design"]] = (
                    r["batch"], r["floor_ms"], r["step_ms"], r["design"], r["kv_bits"], r["cache_bits"])
    return out


def _binds(fl: dict, pts: dict) -> str:
    """The fp8 cache's largest batch against the bf16 cache's (floor tokens/s), and what 2x ShadowKV needs."""
    parts, need = [], []
    for key in sorted(fl, key=lambda k: (MODELS.index(k[0]), k[1])):
        f = fl[key]
        c8, c16, sk = f.get(CACHE + "+fp8cache"), f.get(CACHE + "+fp8"), f.get(SHADOWKV)
        if not (c8 and c16 and sk):
            continue
        tok = lambda r: r[0] / r[1] * 1e3     # noqa: E731 - tokens/s at the HBM floor
        parts.append(f"{key[0]} {fmt_context(key[1])}: batch {c16[0]} to {c8[0]}, floor {tok(c16):,.0f} to {tok(c8):,.0f}"
                     f" tokens/s, step {c16[2] / c16[1]:.2f}x to {c8[2] / c8[1]:.2f}x its floor")
        twice = 2 * pts[key][SHADOWKV][1]
        need.append(f"{key[0]} {fmt_context(key[1])} {tok(c8) / twice:.2f}x (now {c8[2] / c8[1]:.2f}x; ShadowKV's floor"
                    f" {tok(sk):,.0f})")
    return ("What binds (HBM floor: weights, landmarks and attended KV over 4.14 TB/s, `floor_ms` on each row; both"
            " with the fp8 host): " + "; ".join(parts) + ". Every request's landmarks are read at every step, so"
            " the floor grows almost as fast as the batch. 2x ShadowKV bf16 needs the fp8 cache's step within "
            + "; ".join(need) + " of its floor.")


def _ratio(a, b) -> str:
    """a / b at the medians, (min over max - max over min) of the builds."""
    return f"{a[1] / b[1]:.2f} ({a[2] / b[3]:.2f}-{a[3] / b[2]:.2f})"


def _accuracy(root: Path) -> str:
    acc = {r["metric"]: r for r in read_trace_json(root / ACCURACY)["by_selection"] if r["selection"] == "topk"}
    k = [r for r in read_trace_json(root / KERNEL)["rows"] if r["variant"] == "fp8"]
    rel = sorted(r["rel_norm"] for r in k)
    e, floor = acc["fp8_vs_bf16"], acc["bf16_vs_fp32"]
    return (f"Accuracy: the fp8 cache holds the fp8 host's pieces as they are and its tail (window, generated and new"
            f" tokens) in bf16, the numerics the profiler's fp8 copy models (`{ACCURACY}`: the selectable region"
            f" quantised per chunk and KV head, the local window bf16). On SmolLM2's real decode queries over the"
            f" top-k selection its attention output is {e['median']:.1%} from bf16 at the median and {e['p95']:.1%}"
            f" at p95 (bf16's own distance from fp32: {floor['median']:.2%} / {floor['p95']:.2%}); on the H200 the"
            f" kernel over random K/V at Llama-3-8B's heads is {rel[0]:.3f}-{rel[-1]:.3f} (relative norm) from bf16"
            f" (`{KERNEL}`). Task rates with 95 % intervals: docs/profiling.md (its fp8 rows are this cache's). No"
            " second model has been profiled.")


def fp8_cache(root: Path = ROOT) -> str:
    pts, sim, fl = _points(root), _simulated(root), _floors(root)
    rows, gains, errs = [], [], []
    for (model, ctx), got in sorted(pts.items(), key=lambda kv: (MODELS.index(kv[0][0]), kv[0][1])):
        sk, sk8 = got.get(SHADOWKV), got.get("shadowkv+fp8")
        for label, name in NAMES.items():
            if label not in got:
                continue
            r = got[label]
            over = [_ratio(r, sk) if sk and label != SHADOWKV else "-",
                    _ratio(r, sk8) if sk8 and not label.startswith(SHADOWKV) else "-"]
            step_err = sim.get((model, ctx, r[0], *fl[(model, ctx)][label][3:]))
            err = None if step_err is None else 1 / (1 + step_err) - 1          # in tokens/s
            if err is not None:
                errs.append((abs(err), f"{model} {fmt_context(ctx)} {name}, {err:+.1%}"))
            simulated = "not priced" if err is None else f"{r[1] * (1 + err):,.0f} ({err:+.0%})"
            rows.append([model, fmt_context(ctx), name, str(r[0]), f"{r[1]:,.0f} ({r[2]:,.0f}-{r[3]:,.0f})", *over, simulated])
        if CACHE + "+fp8cache" in got and CACHE + "+fp8" in got:
            gains.append(f"{model} {fmt_context(ctx)} {_ratio(got[CACHE + '+fp8cache'], got[CACHE + '+fp8'])}")
    return (f"The fp8 GPU chunk cache on the H200 engine (`traces/engine/{SWEEPS[0]}`, `{SWEEPS[1]}`;"
            " the current engine: the fill's int32 keys, pass 1's 16 splits): e4m3 slots filled with the fp8 host's bytes and scales, read by the attention directly."
            " Each design at its largest batch, tokens/s median (min-max) over 3 builds, 8,192 cache tokens;"
            " ratios at the medians (min over max - max over min); simulated: the engine's step priced by the cost"
            f" model every command uses (`{VALIDATION}`; ShadowKV's 1 KiB fp8 value pieces are smaller than any the"
            " calibration bundle measured). The simulator's largest errors, in tokens/s: "
            + "; ".join(e for _, e in sorted(errs, reverse=True)[:3])
            + ".\n\n"
            + md_table(["model", "context", "design", "batch", "tokens/s", "/ ShadowKV bf16", "/ ShadowKV fp8",
                      "simulated tokens/s"], rows)
            + "\n\nThe fp8 cache over the bf16 cache, both with the fp8 host: " + "; ".join(gains) + ".\n\n"
            + _binds(fl, pts) + "\n\n" + _accuracy(root))
