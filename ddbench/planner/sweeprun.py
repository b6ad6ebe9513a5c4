"""Running a sweep: one row per point, a resumable store, and the tidy table.

Each finished point is appended at once to `<out>/points.jsonl` (key = hash of the point's
parameters), so an interrupted sweep resumes where it stopped and a changed spec reuses every
point it shares with the old one. At the end the rows of the spec's points, in grid order, are
written atomically as `results.parquet` and `results.csv` (units in the column names), with a
summary plot `summary.png` and the validated spec as `spec.json`.
"""

from __future__ import annotations

import json
import math
import os

from ddbench.core.errors import DDBenchError
from ddbench.planner.spec import GRID_FIELDS, point_key, scenario_of

RENAME = {"budget": "budget_tokens", "chunk": "chunk_tokens"}


def sweep_point(p: dict) -> dict:
    """Run one point (in a worker) -> its row: the point's parameters, then the run's results, then
    the batch bounds: max_batch_fit (what admission allows), max_batch_gpu, max_batch_host (None: host
    memory not bounded), bound_by, host_bytes_per_request and host_memory_per_gpu_gb. A point where
    not one request fits in GPU memory, or in host memory, is a row too, with status "does-not-fit"."""
    from ddbench.planner.runs import binding, capacity, run_point
    sc = scenario_of(p)
    res = run_point(sc, float(p["rate"]), int(p["seed"]))
    cap = capacity(sc, int(p["seed"]))
    row = {"key": point_key(p)}
    for k in GRID_FIELDS:
        if k not in ("rate", "seed"):
            row[RENAME.get(k, k)] = p[k]
    row["requests_per_run"] = p["requests"]
    row["max_batch_cap"] = p["max_batch"]
    row.update(res)
    row["max_batch_fit"] = cap["max_batch"]
    for k in ("max_batch_gpu", "max_batch_host", "bound_by", "host_bytes_per_request", "host_memory_per_gpu_gb"):
        row[k] = cap[k]
    row["binding"] = binding(sc, res, int(p["seed"])) if res["completed"] else \
        ("host memory" if cap["bound_by"] == "host memory" else "memory")
    row["status"] = "ok" if res["completed"] else "does-not-fit"
    row.update(_rates_columns(sc, float(p["rate"]), int(p["seed"]), res))
    row["worker_pid"] = os.getpid()
    return row


def _rates_columns(sc, rate: float, seed: int, res: dict) -> dict:
    """The rates the point ran at (one line: values, source, extrapolation), and its tokens/s at the worst and best
    end of their 95 % interval (the same run re-priced; equal to tokens_per_s where they have no interval)."""
    from dataclasses import replace

    from ddbench.planner.ratelines import rates_doc
    from ddbench.planner.runs import run_point
    from ddbench.planner.scenario import resolve
    r = resolve(sc)
    doc = rates_doc([r])
    out = {"rates": doc["designs"][0]["line"] if doc["designs"] else "none (no fetch on a prediction)",
           "tokens_per_s_worst_rates": res.get("tokens_per_s"), "tokens_per_s_best_rates": res.get("tokens_per_s")}
    dr = r.design_rates
    if res.get("completed") and dr is not None and any(x.has_interval for x in dr.rates):
        toks = [res.get("tokens_per_s") or 0.0] + [run_point(replace(sc, rate_end=e), rate, seed)["tokens_per_s"]
                                                  or 0.0 for e in ("low", "high")]
        out["tokens_per_s_worst_rates"], out["tokens_per_s_best_rates"] = min(toks), max(toks)
    return out


def read_store(path: str, expect: dict | None = None) -> dict:
    """key -> row of every complete line of a points.jsonl (a torn line is ignored: an interrupted write).
    With `expect` (key -> point), each row kept for a point is checked as a fresh one would be (`check_row`);
    a file that is not one ddbench wrote (not ASCII JSON lines) or a row that fails is a one-line
    DDBenchError naming the line and the field."""
    done = {}
    if not os.path.exists(path):
        return done
    with open(path, "rb") as fh:
        for n, raw in enumerate(fh, start=1):
            try:
                row = json.loads(raw.decode("ascii"))
            except UnicodeDecodeError:
                raise DDBenchError(f"{path} line {n}: not a store of sweep points (not ASCII JSON lines); move it"
                                   " away to run its points again") from None
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(row, dict) and isinstance(row.get("key"), str):
                row = _renamed(row)
                if expect is not None and row["key"] in expect:
                    check_row(row, expect[row["key"]], f"{path} line {n}")
                done[row["key"]] = row
    return done


SIGNED = ("backlog_growth",)          # result columns that may be negative (a slope)
STATUSES = ("ok", "does-not-fit")


def check_row(row: dict, p: dict, where: str) -> None:
    """A stored row is the point's (its parameters are the point's) and its results are what a run gives:
    numbers finite and not negative (but a slope), a status of a run; else a one-line DDBenchError."""
    want = {RENAME.get(k, k): p[k] for k in GRID_FIELDS if k not in ("rate", "seed")}
    want.update(requests_per_run=p["requests"], max_batch_cap=p["max_batch"], seed=p["seed"])
    bad = [f"{k} is {row.get(k)!r}, the point's is {v!r}" for k, v in want.items() if row.get(k) != v]
    if not isinstance(row.get("rate_req_per_s"), (int, float)) or row["rate_req_per_s"] != float(p["rate"]):
        bad.append(f"rate_req_per_s is {row.get('rate_req_per_s')!r}, the point's is {float(p['rate'])!r}")
    if row.get("status") not in STATUSES:
        bad.append(f"status is {row.get('status')!r}, not one of {', '.join(STATUSES)}")
    for k, v in row.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if not math.isfinite(v):
            bad.append(f"{k} is {v}, not a finite number")
        elif v < 0 and k not in SIGNED:
            bad.append(f"{k} is {v:g}; a run never gives a negative value")
    if bad:
        raise DDBenchError(f"{where}: not a row this sweep wrote ({'; '.join(bad[:4])}"
                           f"{f' and {len(bad) - 4} more' if len(bad) > 4 else ''}); move the file away to run"
                           " its points again")


def _renamed(row: dict) -> dict:
    """A stored row with its columns under today's names (a row written before the rename of the buffer
    layout's `cache` to `buffers` has `cache`), in their order."""
    if "cache" not in row or "buffers" in row:
        return row
    return {("buffers" if k == "cache" else k): v for k, v in row.items()}


class Store:
    def __init__(self, path: str):
        self.path = path
        self.fh = None

    def append(self, row: dict) -> None:
        if self.fh is None:
            torn = False
            if os.path.exists(self.path) and os.path.getsize(self.path):
                with open(self.path, "rb") as fh:
                    fh.seek(-1, os.SEEK_END)
                    torn = fh.read(1) != b"\n"
            self.fh = open(self.path, "a", encoding="utf-8")
            if torn:  # an interrupted write left half a line: end it, so the next row is whole
                self.fh.write("\n")
        self.fh.write(json.dumps(row, allow_nan=False) + "\n")
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()


def write_table(rows: list[dict], w) -> None:
    """results.parquet and results.csv, staged in the output guard's writer `w`."""
    import pandas as pd
    df = pd.DataFrame(rows)
    df.to_parquet(w.stage_path("results.parquet"), index=False)
    df.to_csv(w.stage_path("results.csv"), index=False)


def summary_plot(rows: list[dict], spec: dict, path: str) -> None:
    """P99 completion and tokens/s against the rate, one line per combination of the other varying
    fields (first seed only; at most 12 lines, the legend says how many were left out). `path` is a
    staged file of the output guard."""
    from ddbench.plotting import new_figure, plt
    g = spec["grid"]
    vary = [k for k in GRID_FIELDS if len(g.get(k, [None])) > 1 and k not in ("rate", "seed")]
    seed0 = g["seed"][0]
    lines: dict = {}
    for r in rows:
        if r["seed"] != seed0:
            continue
        label = ", ".join(f"{r[RENAME.get(k, k)]}" for k in vary) or r["system"]
        lines.setdefault(label, []).append(r)
    fig = new_figure(8.0, 3.4)
    ax1, ax2 = fig.subplots(1, 2)
    shown = list(lines)[:12]
    for label in shown:
        pts = sorted(lines[label], key=lambda r: r["rate_req_per_s"])
        x = [r["rate_req_per_s"] for r in pts]
        ax1.plot(x, [r["completion_p99_s"] if r["completion_p99_s"] is not None else math.nan for r in pts],
                 marker="o", ms=2.5, lw=0.8, label=label)
        ax2.plot(x, [r["tokens_per_s"] if r["tokens_per_s"] is not None else math.nan for r in pts],
                 marker="o", ms=2.5, lw=0.8, label=label)
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("arrival rate (requests/s)")
    if any((r["completion_p99_s"] or 0) > 0 for r in rows if r["seed"] == seed0):
        ax1.set_yscale("log")   # (not where no point completed a request: nothing to draw)
    ax1.set_ylabel("P99 completion (s)")
    ax2.set_ylabel("tokens/s")
    extra = f" (+{len(lines) - len(shown)} not drawn)" if len(lines) > len(shown) else ""
    ax1.legend(fontsize=6, title=(", ".join(vary) or "system") + extra, title_fontsize=6)
    fig.suptitle(f"sweep {spec.get('name') or ''}: {len(rows)} points, {spec['requests']} requests per run"
                 f" (seed {seed0})", fontsize=8)
    fig.savefig(path, format="png")
    plt.close(fig)
