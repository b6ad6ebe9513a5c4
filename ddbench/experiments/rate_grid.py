"""The current engine's matched-rate run, for the figures that compare designs on the engine.

traces/engine/h200-rate-grid (its README): one engine version, Llama-3-8B on one H200, each design at its
largest batch over a grid of forced rates, 3 builds in separate processes (2 at 64K): dualdecoder-cache at 4x
the budget at 32K / 64K / 128K, ShadowKV and DualDecoder at 128K. A figure takes, per design and context, the
two grid points around the matched rate set's centre (the rates `ddbench plan` prices the design with, from
ddbench.core.rates), and says which point it took; a design or context the grid lacks is simulated at the
matched rates and labelled so.

    matched_rates(design, context)  -> {"urgent", "churn"} (a chunk cache) or {"miss"}: the matched set's centre
    engine_at_matched(design, context) -> the grid points around that centre (min / median / max over builds)
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

RUN = "h200-rate-grid"
MODEL, GPU = "llama-3-8b", "h200"
CAPACITY = 4                     # the grid's chunk cache: 8192 tokens per layer and KV head, 4x the budget
MIB = 2 ** 20


@lru_cache(maxsize=None)
def grid_rows() -> pd.DataFrame:
    """The run's engine rows (typed: one-line errors), one per build and point."""
    from ddbench.core.traces import load_engine
    path = traces_dir("engine", RUN, "engine.csv")
    if not path.exists():
        raise DDBenchError(f"{path}: missing (traces/engine/{RUN}/README.md says how it was run)")
    e = load_engine(str(path))
    return e[e.status.isin(["ok", "ok-no-twin"])].copy()


@lru_cache(maxsize=None)
def run_date() -> str:
    """The run's date (its meta.json), for captions."""
    from ddbench.core.io import read_json_object
    meta = read_json_object(traces_dir("engine", RUN, "meta.json"), "engine run meta", f"traces/engine/{RUN}")
    return str((meta.get("provenance") or {}).get("date_utc", "date not recorded"))[:10]


def has_chunk_cache(design: str) -> bool:
    from ddbench.core.designs import get_design
    return get_design(design).chunk_cache


@lru_cache(maxsize=None)
def matched_rates(design: str, context: int) -> dict:
    """The matched rate set's centre at one context (the run's model): a chunk cache's urgent share and churn
    (per budget, mean over layers), another design's miss (1 - its mean rate), as `plan` prices them."""
    from ddbench.experiments.scene import scene
    knobs = {"cache_tokens": CAPACITY * D.BUDGET} if has_chunk_cache(design) else {}
    r = scene(MODEL, design, gpu=GPU, **knobs)
    if has_chunk_cache(design):
        c = r.cache_rates_at(context)
        return {"urgent": sum(c.urgent) / len(c.urgent), "churn": sum(c.prefetched) / len(c.prefetched)}
    h = r.hits_at(context)[0]
    return {"miss": 1 - sum(h) / len(h)}


def bracket(values, x: float) -> tuple[float, float]:
    """The grid values around x: the largest at or below it and the smallest at or above it (the grid's end
    where it does not reach x; then both ends may be the same value)."""
    g = sorted(set(float(v) for v in values))
    below = [v for v in g if v <= x + 1e-12]
    above = [v for v in g if v >= x - 1e-12]
    return (below[-1] if below else g[0]), (above[0] if above else g[-1])


def _row(design: str, context: int, g, want: dict, end: str, urgent: float, churn: float | None) -> dict:
    if g.batch.nunique() != 1:
        raise DDBenchError(f"traces/engine/{RUN}: {design} at {context} ran at batches {sorted(g.batch.unique())}")
    cache = churn is not None
    return dict(source="engine", run=RUN, rates_end=end, context=int(context), design=design,
                batch=int(g.batch.iloc[0]), builds=len(g), tok_s=float(g.tok_s.median()),
                tok_s_min=float(g.tok_s.min()), tok_s_max=float(g.tok_s.max()), step_ms=float(g.step_ms.median()),
                step_over_hbm_floor=float((g.step_ms / g.floor_ms).median()),
                link_mib_per_token=float((g.link_mib / g.batch).median()),
                urgent_mib_per_token=float((g.urgent_mib / g.batch).median()), link_gbps=float(g.link_gbps.median()),
                forced_urgent=urgent if cache else None, forced_churn=churn, forced_miss=None if cache else urgent,
                cache_tokens=CAPACITY * D.BUDGET if cache else None,
                matched_urgent=want.get("urgent"), matched_churn=want.get("churn"), matched_miss=want.get("miss"))


def engine_at_matched(design: str, context: int) -> list[dict]:
    """The two grid points around the matched rates' centre, each rate at the grid value at or below it
    (rates_end "lower": fewer chunks moved) and at or above it ("higher"): tokens/s min / median / max over
    the point's builds, the batch, the rates it ran at and the link bytes per token; [] where the grid has no
    row of the design at that context. Where the centre lies beyond the grid, both ends are the grid's end."""
    e = grid_rows()
    e = e[(e.design == design) & (e.context == context) & (e.model == MODEL)]
    if not len(e):
        return []
    want = matched_rates(design, context)
    urgent = e.forced_urgent_or_miss.astype(float)
    churn = e.forced_churn.astype(float)
    u_ends = bracket(urgent, want["urgent" if "urgent" in want else "miss"])
    c_ends = bracket(churn.dropna(), want["churn"]) if "churn" in want else (None, None)
    rows = []
    for end, u, c in zip(("lower", "higher"), u_ends, c_ends):
        g = e[((urgent - u).abs() < 1e-9) & (((churn - c).abs() < 1e-9) if c is not None else True)]
        rows.append(_row(design, context, g, want, end, u, c))
    return rows


def _cache_row(r) -> bool:
    return r.get("forced_churn") is not None and not pd.isna(r.get("forced_churn"))


def point_note(r) -> str:
    """Where an engine row of engine_at_matched ran: its grid point."""
    if _cache_row(r):
        return f"urgent {r['forced_urgent']:g}, churn {r['forced_churn']:g}"
    return f"miss {r['forced_miss']:g}"


def bracket_note(rows) -> str:
    """The grid points of engine_at_matched's rows (one where both ends are the same), against the matched
    centre: 'urgent 0.01, churn 0.05 / urgent 0.01, churn 0.1 (matched urgent 0.009, churn 0.078)'."""
    r = rows[0]
    centre = (f"urgent {r['matched_urgent']:.3f}, churn {r['matched_churn']:.3f}" if _cache_row(r)
              else f"miss {r['matched_miss']:.3f}")
    return " / ".join(dict.fromkeys(point_note(x) for x in rows)) + f" (matched {centre})"
