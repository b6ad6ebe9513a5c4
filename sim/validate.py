"""`python -m ddbench.sim.validate`: the simulator against the decode-step engine measured on the H200.

    python -m ddbench.sim.validate [--calibration-engine traces/engine/h200] [--engine traces/engine/h200-validation]
                           [--allow-same-run] [--out traces/validation/h200-engine.csv] [--force]

    python -m ddbench.sim.validate --user-path      # the user's path (ddbench simulate --batch) at the validated
                                            # sweep's points with transfers, by design and regime; no files

The replay and its rules: sim/fit/validation.py. This module is the command: it writes, through the output
guard (ddbench.core.outputs.output_folder, all files of a run at once, nothing left on an error), the
per-point CSV of each validated sweep and its `<stem>-summary.json` (errors by regime and design, link
bytes agreement, the cost model's notes), and the folder's README.md. Besides the four sweeps (the
validated one, held-out, cache, fp8: all measured before the in-place ShadowKV step, so their ShadowKV
rows carry that engine's fetch, and their chunk-cache rows the torch fill), three validations of the
in-place engine: `<stem>-inplace.csv` (ShadowKV in place: traces/engine/h200-shadowkv-fast builds,
paper-80gb and fp8, and h200-rates' ShadowKV rows), `<stem>-rates.csv` (h200-rates' chunk-cache grid and
the other designs at batch 1), `<stem>-ablation.csv` (issue 31's ablation, the fused fill) and `<stem>-fill.csv`
(the fused fill's sweep at 32K / 64K / 128K, traces/engine/h200-cache-fill, whose overlap points it is fitted to)
`<stem>-fp8cache.csv` (issue 32's fp8 GPU chunk cache, h200-cache-fp8 and h200-cache-fp8-qwen) and `<stem>-compare.csv`
(the same comparison on the current engine: h200-compare and h200-compare-qwen, whose bf16 cache rows the fill is
fitted to) and `<stem>-rategrid.csv` (traces/engine/h200-rate-grid: the engine over a grid of forced rates, fitted to
nothing), each with
its points' min / median / max over their builds in the summary (`per_point`). Default folder: the data root's
validation/ (traces/validation/). Imports no torch.
"""

from __future__ import annotations

import os
import sys

from ddbench.core.flags import OneLineParser
from ddbench.core.errors import DDBenchError
from ddbench.core.outputs import output_folder
from ddbench.core.paths import traces_dir
from ddbench.sim.fit.validation import (ABLATION_RUNS, CACHE_SWEEP, COMPARE_RUNS, FILL_RUNS, FP8_CACHE_RUNS, RATE_GRID_RUNS, CALIBRATION_FLOOR_SWEEP, CALIBRATION_SWEEP, FP8_SWEEP, GPU,
                                HELD_OUT_SWEEP, INPLACE_RUNS, LINK, MODEL, RATES_RUNS, STEPS, VALIDATION_SWEEP, WARMUP,
                                user_path_errors, validate, validate_runs)
from ddbench.sim.fit.summary import summarize

COMMAND = "python -m ddbench.sim.validate"
# the validations of the in-place engine, each written as <out stem>-<tag>.csv
RUN_SETS = (("inplace", INPLACE_RUNS), ("rates", RATES_RUNS), ("ablation", ABLATION_RUNS), ("fill", FILL_RUNS),
            ("fp8cache", FP8_CACHE_RUNS), ("compare", COMPARE_RUNS), ("rategrid", RATE_GRID_RUNS))
README = "README.md"


def header_lines(summary: dict, notes) -> list[str]:
    """What the run replayed and how it was costed: the summary JSON's "header" (the CSV stays plain)."""
    lines = [f"sim vs engine: {', '.join(summary.get('models', [MODEL]))} on {GPU} + {LINK}, timeline mode {STEPS}"
             f" steps ({WARMUP} warm-up)" + (f"; HELD OUT: the compute terms were fitted to {summary['fitted_model']}"
                                            " only" if summary.get("held_out") else "")]
    lines += [f"cost model: {n}" for n in notes]
    lines.append(f"regime rule: {summary['rule']}")
    lines += [_sweep_line(k + " sweep", summary["sweeps"].get(k, {})) for k in ("calibration", "validated")]
    if summary["sweeps"].get("same_run"):
        lines.append("SAME RUN: the validated points come from the calibration run")
    return lines


def write(w, t, summary, notes, name: str) -> str:
    """The points as a plain CSV `name` in the output folder (w: its ddbench.core.outputs Writer) and the
    summary, with its header lines, beside it; the summary's name."""
    t.to_csv(w.stage_path(name), index=False, float_format="%.6g")
    js = os.path.splitext(name)[0] + "-summary.json"
    w.write_json(js, {**summary, "header": header_lines(summary, notes)})
    return js


def _sweep_line(name: str, x: dict) -> str:
    return (f"{name}: {x.get('folder')} (run {x.get('run_id') or 'without run_id'}, git {x.get('git_sha')},"
            f" {x.get('date_utc')}, phases {x.get('phases') or 'all'}, seed {x.get('seed', 0) if x.get('seed') is not None else 0})")


def report(summary: dict) -> str:
    sw = summary.get("sweeps", {})
    lines = [_sweep_line("calibration sweep", sw.get("calibration", {})),
             _sweep_line("validated sweep", sw.get("validated", {}))]
    if sw.get("same_run"):
        lines.append("SAME RUN: the validated points come from the calibration run (other points, same run)")
    if sw and not sw.get("same_code"):
        lines.append("the two sweeps ran different engine code (git shas differ)")
    lines.append(f"{summary['points']} engine points replayed (none used for calibration)")
    for s in summary["skipped"]:
        lines.append(f"  skipped {s}")
    for k, v in summary["regimes"].items():
        if v["points"]:
            lines.append(f"{k} ({v['points']} points): median |error| {v['median_abs_error']:.1%}, worst"
                         f" {v['worst_abs_error']:.1%} ({v['worst_point']}); sim / engine median"
                         f" {v['median_sim_over_engine']:.3f}")
    b = summary["link_bytes"]
    lines.append(f"link bytes per step: {b['exact']} of {b['points_with_transfers']} points with transfers equal"
                 f" to the byte (largest difference {b['max_abs_diff_bytes']:.0f} B)")
    for p in summary["fifo_over_priority"]:
        lines.append(f"FIFO / priority {p['context'] // 1024}K b{p['batch']} miss {p['miss_rate']} ({p['reps']} reps):"
                     f" engine {p['engine']:.3f} ({p['engine_min']:.3f}-{p['engine_max']:.3f}), sim {p['sim']:.3f}")
    return "\n".join(lines)


def write_readme(w, sections) -> str:
    """README.md in the output folder: per validation (the fitted shapes, then the held-out ones): which
    sweeps were used, the rule and the errors by regime and design. sections: [(summary, csv, json)]."""
    files = ", ".join(f"`{os.path.basename(c)}` and `{os.path.basename(j)}`" for _, c, j in sections)
    lines = ["# Simulator against the decode-step engine (`python -m ddbench.sim.validate`)", "",
             f"Written by `python -m ddbench.sim.validate`: {files} (one row per replayed point, and its summary)."
             " Do not edit; rerun it.", ""]
    for summary, csv, _ in sections:
        title = (f"Held out: {', '.join(summary['models'])} (the compute terms were fitted to"
                 f" {summary['fitted_model']} only)" if summary.get("held_out")
                 else f"The in-place engine ({', '.join(summary['models'])}), {len(summary['per_point'])} points"
                 if summary.get("per_point")
                 else f"The chunk-cache sweep {summary['sweeps'].get('validated', {}).get('folder')}:"
                      f" {', '.join(summary['models'])}" if summary.get("cache_held_out")
                 else f"Fitted shapes: {', '.join(summary['models'])}")
        lines += [f"## {title} (`{os.path.basename(csv)}`)", "", "Sweeps (kernels/engine/sweep.py runs):", "",
                  f"- {_sweep_line('calibration', summary['sweeps'].get('calibration', {}))}: its floor phase gives"
                  " the harness term (its forced-miss steps against its own-selection ones)",
                  f"- {_sweep_line('validated', summary['sweeps'].get('validated', {}))}: its points are replayed", ""]
        if summary["sweeps"].get("same_run"):
            lines += ["**The validated points come from the same run as the calibration points** (other points of"
                      " that run; `--allow-same-run`): not an independent validation.", ""]
        lines += [summary["calibration"], "", summary["harness"] + ".", "", f"Regimes: {summary['rule']}.", "",
                  "| regime | points | median \\|error\\| | worst | sim / engine, median |",
                  "| --- | --- | --- | --- | --- |"]
        for k, v in (list(summary["regimes"].items()) + list(summary.get("by_design", {}).items())
                     + [(k, v) for k, v in summary.get("cache_held_out", {}).items() if k != "fitted points"]):
            if v["points"]:
                lines.append(f"| {k} | {v['points']} | {v['median_abs_error']:.1%} | {v['worst_abs_error']:.1%}"
                             f" ({v['worst_point']}) | {v['median_sim_over_engine']:.3f} |")
            elif k in summary["regimes"]:
                lines.append(f"| {k} | 0 | | | |")
        if summary.get("cache_held_out"):
            lines += ["", "dualdecoder-cache's fill term (sim/fit/cachefill.py) was fitted to this run at one context"
                      f" (its points in the overlap regime); the {summary['cache_held_out']['fitted points']['points']}"
                      " points at that context are marked in column cache_fill_fitted, and the rows '(fill not"
                      " fitted here)' are the other contexts."]
        if summary.get("per_point"):
            lines += ["", "Per point over its builds (error = sim / engine - 1):", "",
                      "| model | design | context | batch | miss | churn | kv bits | cap | builds | engine ms median"
                      " (min-max) | sim ms | error median (min..max) |", "| --- | --- | --- | --- | --- | --- | --- | ---"
                      " | --- | --- | --- | --- |"]
            for x in summary["per_point"]:
                lines.append(f"| {x['model']} | {x['design']} | {x['context'] // 1024}K | {x['batch']} | {x['miss_rate']}"
                             f" | {x['churn_rate'] or '-'} | {x['kv_bits']} | {x['gpu_mem_cap']} | {x['builds']} |"
                             f" {x['engine_ms_median']:.2f} ({x['engine_ms_min']:.2f}-{x['engine_ms_max']:.2f}) |"
                             f" {x['sim_ms']:.2f} | {x['error_median']:+.1%} ({x['error_min']:+.1%}..{x['error_max']:+.1%}) |")
        b = summary["link_bytes"]
        lines += ["", f"Link bytes per step equal to the byte at {b['exact']} of {b['points_with_transfers']} points"
                  f" with transfers. Skipped: {len(summary['skipped'])} rows (listed in the summary).", ""]
    w.write_text(README, "\n".join(lines))
    return README


def main(argv=None) -> int:
    ap = OneLineParser(prog="python -m ddbench.sim.validate", description=__doc__.splitlines()[0])
    ap.add_argument("--engine", help="the validated sweep's folder (engine.csv, meta.json; default the data root's"
                                     f" engine/{VALIDATION_SWEEP} where it exists, else engine/{CALIBRATION_SWEEP})")
    ap.add_argument("--calibration-engine", help="the sweep whose compute-only floor steps calibrate the simulator's"
                                                 f" compute (default the data root's engine/{CALIBRATION_FLOOR_SWEEP}"
                                                 f" where it exists, else engine/{CALIBRATION_SWEEP})")
    ap.add_argument("--allow-same-run", action="store_true",
                    help="validate points of the calibration run itself (other points, same run)")
    ap.add_argument("--out", help="output CSV (default the data root's validation/h200-engine.csv)")
    ap.add_argument("--user-path", action="store_true",
                    help="print the user's path (ddbench simulate --batch, no harness term) against the validated"
                         " sweep's points with transfers, by design and regime; writes nothing")
    ap.add_argument("--held-out", metavar="DIR",
                    help="a sweep of other models' shapes (the engine's --model), replayed with the same fitted"
                         f" cost model: written as <out stem>-heldout.csv (default the data root's engine/{HELD_OUT_SWEEP}"
                         " where it exists; 'none' skips it)")
    ap.add_argument("--cache", metavar="DIR",
                    help="a sweep of the chunk-cache design (its paper phase with --designs dualdecoder-cache,...),"
                         f" replayed too: written as <out stem>-cache.csv (default the data root's engine/{CACHE_SWEEP}"
                         " where it exists; 'none' skips it)")
    ap.add_argument("--fp8", metavar="DIR",
                    help="a sweep with fp8 host KV (its paper phase with --kv-bits 8,16), replayed too: written as"
                         f" <out stem>-fp8.csv (default the data root's engine/{FP8_SWEEP} where it exists; 'none'"
                         " skips it)")
    ap.add_argument("--in-place", metavar="on|none", default="on",
                    help="the in-place ShadowKV validation (traces/engine/h200-shadowkv-fast, h200-rates' ShadowKV"
                         " rows) and h200-rates' other rows: <out stem>-inplace.csv and -rates.csv ('none' skips them)")
    ap.add_argument("--force", action="store_true",
                    help="write into a folder that holds other files (they are kept; ddbench's own are replaced)")
    a = ap.parse_args(argv)
    held = a.held_out
    cache_dir, fp8_dir = a.cache, a.fp8
    if cache_dir is None:
        d = str(traces_dir("engine", CACHE_SWEEP))
        cache_dir = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    if fp8_dir is None:
        d = str(traces_dir("engine", FP8_SWEEP))
        fp8_dir = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    if held is None:
        d = str(traces_dir("engine", HELD_OUT_SWEEP))
        held = d if os.path.exists(os.path.join(d, "engine.csv")) else "none"
    try:
        if a.user_path:
            for d in [a.engine] + ([] if held == "none" else [held]):
                t, summ = user_path_errors(d)
                for r in t.itertuples():
                    print(f"{r.model:12s} {r.design:18s} {r.context // 1024:4d}K b{r.batch:<3d} miss {r.miss_rate:5s}"
                          f" {r.regime:12s} engine {r.engine_step_ms:8.2f} ms  simulate {r.user_step_ms:8.2f} ms"
                          f"  {r.user_over_engine - 1:+.1%}")
                for k, x in summ.items():
                    if k == "left_out":
                        print(f"left out: {x['points']} ({x['why']})")
                        continue
                    print(f"{k}: {x['points']} points, median |error| {x['median_abs_error']:.1%}, worst"
                          f" {x['worst_abs_error']:.1%}")
            return 0
        a.out = a.out or str(traces_dir("validation", "h200-engine.csv"))
        runs = [(a.engine, a.out, False)]
        if held != "none":
            runs.append((held, os.path.splitext(a.out)[0] + "-heldout.csv", True))
        if cache_dir != "none":
            runs.append((cache_dir, os.path.splitext(a.out)[0] + "-cache.csv", False))
        if fp8_dir != "none":
            runs.append((fp8_dir, os.path.splitext(a.out)[0] + "-fp8.csv", False))
        results = [(validate(d, a.calibration_engine, allow_same_run=a.allow_same_run, held_out=h), out)
                   for d, out, h in runs]
        if a.in_place != "none":
            for tag, spec in RUN_SETS:
                if all(os.path.exists(os.path.join(str(traces_dir("engine", f)), "engine.csv")) for f, _ in spec):
                    results.append((validate_runs(spec, a.calibration_engine),
                                    os.path.splitext(a.out)[0] + f"-{tag}.csv"))
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        return _write(a, results)
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _write(a, results) -> int:
    """Every run's points and summary, and the README, into the --out folder through the output guard."""
    folder = os.path.dirname(os.path.abspath(a.out))
    names = [os.path.basename(out) for _, out in results]
    with output_folder(folder, command=COMMAND, flag="--out", own_ok=True, force=a.force, prune=False) as w:
        w.claim(names + [os.path.splitext(n)[0] + "-summary.json" for n in names] + [README])
        sections, lines = [], []
        for ((t, skipped, meta, notes), out), n in zip(results, names):
            summary = summarize(t, skipped, meta)
            js = write(w, t, summary, notes, n)
            sections.append((summary, n, js))
            lines += [("HELD OUT\n" if summary["held_out"] else "") + report(summary),
                      f"wrote {out} and {os.path.join(os.path.dirname(out), js)}"]
        write_readme(w, sections)
    print("\n".join(lines + [f"wrote {os.path.join(os.path.dirname(a.out), README)}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
