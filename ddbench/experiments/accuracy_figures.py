"""The paper's accuracy experiments, replayed from measured accuracy profiles
(traces/accuracy/<model>.csv, .summary.json, .steps.csv, written by `ddbench profile --layer-accuracy`;
schema in ddbench/profile/trace.py); the simulator's sensitivity to them is sensitivity_figure.py:

  fig07        (a) token against KV prediction accuracy over decode steps; (b) T2 against random
               initialisation of the first speculative token
  fig16        KV prediction accuracy by model, context and task (and per layer, with §5.3's low-rank set)
  table1       task accuracy: dense, sparse exact top-k (what DualDecoder computes once misses are
               fetched), low-rank-key selection (ShadowKV's), per task and budget

Rates are read with sim/hitrates.py's selection: first speculative token T2, output token sampled at
temperature 0.6 (the speculative token is the argmax; greedy with T2 makes every hit 1.0 by
construction), the smallest measured budget, every context and task averaged (n-weighted). Every
figure names the model measured, its layer count and context; the paper's numbers come from its
own models at up to 128K, and ours are never labelled as theirs. No trace: a one-line DDBenchError
that names the figure and the command that writes the trace.
"""

from __future__ import annotations

import glob
import os
from functools import lru_cache

import pandas as pd

from ddbench.core.designs import DUALDECODER, SHADOWKV
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.units import fmt_tokens
from ddbench.experiments import Comparison, FigureResult, register
from ddbench.plotting import SYSTEM_COLORS

PROFILE_CMD = "ddbench profile --layer-accuracy --model PATH"
# the paper's tasks (RULER) against the nearest synthetic task the profiler builds (ddbench/profile/tasks.py)
TABLE1_TASKS = {"niah-1": "single", "niah-2": "multikey", "niah-3": "multivalue", "qa-2": None}
TABLE1_SYSTEMS = {SHADOWKV: "lowrank", DUALDECODER: "sparse"}


# ---------------------------------------------------------------- reading the traces
def _models() -> tuple:
    from ddbench.core.traces import is_profile_layer_csv
    folder = traces_dir("accuracy")
    return tuple(sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(str(folder), "*.csv"))
                        if is_profile_layer_csv(os.path.basename(p))))


def profiled_models(fig: str) -> tuple:
    models = _models()
    if not models:
        raise DDBenchError(f"{fig}: no accuracy profile in {traces_dir('accuracy')} (<model>.csv); write one with"
                           f" `{PROFILE_CMD}`")
    return models


def profile_path(model: str, kind: str) -> str:
    suffix = {"csv": ".csv", "summary": ".summary.json", "steps": ".steps.csv"}[kind]
    return str(traces_dir("accuracy", model + suffix))


def _summary(model: str) -> dict:
    return _summary_at(profile_path(model, "summary"))


@lru_cache(maxsize=None)
def _summary_at(path: str) -> dict:
    from ddbench.sim.hitrates import read_summary
    doc = read_summary(path)               # typed: one line naming the file where it is not a summary
    for key in ("model", "shape", "task_accuracy", "lowrank_layers"):
        if not isinstance(doc, dict) or key not in doc:
            raise DDBenchError(f"malformed accuracy summary {path}: field {key}: missing")
    return doc


def profile_rates(model: str, init: str = "t2", temperature: float = 0.6, context=None, task=None):
    return _profile_at(profile_path(model, "csv"), init, temperature, context, task)


@lru_cache(maxsize=None)
def _profile_at(path: str, init, temperature, context, task):
    from ddbench.sim.hitrates import Select, read_hitrates
    return read_hitrates(path, Select(init=init, temperature=temperature, context=context, task=task))


def _rows(model: str) -> pd.DataFrame:
    profile_rates(model)   # validates the file line by line first (one-line errors naming line and field)
    return _rows_at(profile_path(model, "csv"))


@lru_cache(maxsize=None)
def _rows_at(path: str) -> pd.DataFrame:
    try:
        return pd.read_csv(path, comment="#")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DDBenchError(f"cannot read accuracy profile {path}: {str(exc).splitlines()[0]}") from None


def _steps(model: str) -> pd.DataFrame:
    return _steps_at(profile_path(model, "steps"))


@lru_cache(maxsize=None)
def _steps_at(path: str) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, comment="#")
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise DDBenchError(f"cannot read accuracy steps {path}: {str(exc).splitlines()[0]}") from None
    need = ("context_tokens", "task", "init", "temperature", "budget_tokens", "step", "hit_rate", "token_acc")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise DDBenchError(f"malformed accuracy steps {path}: line 1, field {missing[0]}: missing from the header")
    for c in ("hit_rate", "token_acc", "temperature", "step", "budget_tokens", "context_tokens"):
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna()
        if c in ("hit_rate", "token_acc"):
            bad |= (v < 0) | (v > 1)
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise DDBenchError(f"malformed accuracy steps {path}: line {i + 2}, field {c}: {str(df[c].iloc[i])!r} is not"
                               f" {'a rate in [0, 1]' if c in ('hit_rate', 'token_acc') else 'a number'}")
    return df


def _layers(model: str) -> int:
    return int(_summary(model)["shape"]["layers"])


def _who(model: str) -> str:
    """'<model> (<L> layers)': how every figure names what was measured."""
    return f"{model} ({_layers(model)} layers)"


def profiled_contexts(model: str) -> str:
    return "/".join(fmt_tokens(int(c)) for c in sorted(_rows(model).context_tokens.unique()))


def paper_value(pid: str) -> float:
    from ddbench.core.paper_numbers import reported
    return reported()[pid].value


def _caveat(model: str) -> str:
    return (f"measured on {_who(model)} at {profiled_contexts(model)} tokens; the paper's numbers are from its own models at up to"
            f" 128K, not this model")


# ---------------------------------------------------------------- Figure 7
def _draw_fig7(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(7.6, 3.4)
    a, b = fig.subplots(1, 2, width_ratios=[1.5, 1])
    s = df[df.panel == "a"]
    for model, sub in s.groupby("model", sort=False):
        a.plot(sub.step, 100 * sub.kv_accuracy, color=SYSTEM_COLORS[DUALDECODER], lw=1.2,
               label=f"KV prediction (mean {100 * sub.kv_accuracy.mean():.1f}%)")
        a.plot(sub.step, 100 * sub.token_accuracy, color="#9467bd", lw=0.8, marker=".", ms=3,
               label=f"token prediction (mean {100 * sub.token_accuracy.mean():.1f}%)")
    a.axhline(100 * paper_value("fig7a.kv_accuracy.mean"), color="black", ls="--", lw=0.8,
              label="paper: KV prediction 88% on average (its models)")
    a.set_ylim(0, 105)
    a.set_xlabel("decode step (steps after the pre-decoding step)")
    a.set_ylabel("accuracy (%)")
    first = s.iloc[0]
    ctxs = first.contexts if "contexts" in s.columns and isinstance(first.contexts, str) else \
        fmt_tokens(int(first.context_tokens))
    bud = f", budget {int(first.budget_tokens)}" if pd.notna(first.budget_tokens) else ""
    a.set_title(f"(a) {first.model}, context {ctxs} (averaged){bud},\nT2 start, temperature "
                f"{first.temperature:g}", fontsize=7)
    a.legend(fontsize=6, loc="lower left")
    box = dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.5)
    p = df[df.panel == "b"]
    temps = sorted(p.temperature.unique())
    width = 0.38
    for k, (init, color) in enumerate((("t2", SYSTEM_COLORS[DUALDECODER]), ("random", "#bcbd22"))):
        sub = p[p.init == init].set_index("temperature").reindex(temps)
        xs = [i + (k - 0.5) * width for i in range(len(temps))]
        bars = b.bar(xs, 100 * sub.kv_accuracy, width, color=color, label=f"{init} start")
        b.bar_label(bars, fmt="%.0f", fontsize=6, padding=1)
    right = len(temps) - 0.5
    b.axhline(100 * paper_value("fig7b.random_init.kv_accuracy.mean"), color="black", ls=":", lw=0.8)
    b.text(right, 100 * paper_value("fig7b.random_init.kv_accuracy.mean"), "paper: random 56%", fontsize=6,
           ha="right", va="center", bbox=box)
    b.axhline(100 * paper_value("fig7a.kv_accuracy.mean"), color="black", ls="--", lw=0.8)
    b.text(right, 100 * paper_value("fig7a.kv_accuracy.mean"), "paper: T2 88%", fontsize=6, ha="right", va="center",
           bbox=box)
    b.set_xticks(range(len(temps)), [f"T={t:g}" + (" (greedy)" if t == 0 else "") for t in temps], fontsize=7)
    b.set_xlim(-0.5, right)
    b.set_ylim(0, 118)
    b.set_xlabel("output sampling temperature\n(speculative token: argmax)")
    b.set_ylabel("KV prediction accuracy (%)")
    b.set_title("(b) first speculative token: T2 or random", fontsize=7)
    b.legend(fontsize=6, loc="upper right", ncol=2)
    fig.suptitle(f"Fig. 7: KV prediction accuracy measured on {_who(first.model)}, not the paper's models",
                 fontsize=8)


@register("fig07", "Token against KV prediction accuracy over decode steps; T2 against random start (paper Figure 7)",
          _draw_fig7)
def fig07() -> FigureResult:
    model = profiled_models("fig07")[0]
    prof = profile_rates(model)
    budget = prof.budgets[0] if len(prof.budgets) == 1 else None
    st = _steps(model)
    sel = st[(st.init == "t2") & ((st.temperature - 0.6).abs() < 1e-9)]
    if budget is not None:
        sel = sel[sel.budget_tokens == budget]
    if sel.empty:
        raise DDBenchError(f"fig07: {profile_path(model, 'steps')} has no rows at init t2, temperature 0.6"
                           f"{f', budget {budget}' if budget else ''}")
    per = sel.groupby("step").agg(kv_accuracy=("hit_rate", "mean"), token_accuracy=("token_acc", "mean"),
                                  runs=("hit_rate", "size")).reset_index()
    ctx_names = "+".join(fmt_tokens(int(c)) for c in sorted(sel.context_tokens.unique()))
    rows = [{"panel": "a", "model": model, "layers": _layers(model),
             "context_tokens": int(sel.context_tokens.max()) if sel.context_tokens.nunique() == 1 else -1,
             "contexts": ctx_names,
             "budget_tokens": budget, "init": "t2", "temperature": 0.6, "step": int(r.step),
             "kv_accuracy": r.kv_accuracy, "token_accuracy": r.token_accuracy, "runs": int(r.runs)}
            for r in per.itertuples()]
    df0 = _rows(model)
    inits = [i for i in ("t2", "random") if i in set(df0.init)]
    for t in sorted(df0.temperature.unique()):
        for init in inits:
            p = profile_rates(model, init, float(t))
            rows.append({"panel": "b", "model": model, "layers": _layers(model),
                         "context_tokens": int(df0.context_tokens.max()) if df0.context_tokens.nunique() == 1 else -1,
                         "contexts": "+".join(fmt_tokens(int(c)) for c in sorted(p.contexts)) if p.contexts
                         else ctx_names,
                         "budget_tokens": budget, "init": init, "temperature": float(t), "step": None,
                         "kv_accuracy": p.hit_mean, "token_accuracy": p.token_acc, "runs": p.rows})
    df = pd.DataFrame(rows)
    df["step"] = df["step"].astype("Int64")
    tok = per.token_accuracy.mean()
    cmp = [Comparison("fig7a.kv_accuracy.mean", round(prof.hit_mean, 3),
                      f"{_caveat(model)}; {prof.selection}; mean over {_layers(model)} layers and "
                      f"{int(per.step.max()) + 1} steps; token prediction accuracy {tok:.1%} over the same steps "
                      f"(KV prediction is higher, as in the paper)")]
    if "random" in inits:
        rnd = profile_rates(model, "random", 0.6)
        cmp.append(Comparison("fig7b.random_init.kv_accuracy.mean", round(rnd.hit_mean, 3),
                              f"{_caveat(model)}; random first speculative token, {rnd.selection}; T2 start "
                              f"{prof.hit_mean:.1%} (drop {prof.hit_mean - rnd.hit_mean:+.1%}; the paper's drop is"
                              f" {paper_value('fig7b.random_init.kv_accuracy.mean') - paper_value('fig7a.kv_accuracy.mean'):+.0%})"))
    setup = f"{_caveat(model)}; {prof.selection}; panel (b) per temperature, same selection otherwise"
    return FigureResult(df, setup, cmp)


# ---------------------------------------------------------------- Figure 16
def _draw_fig16(res: FigureResult, fig) -> None:
    df = res.data
    fig.set_size_inches(7.6, 4.2)
    a, b = fig.subplots(1, 2, width_ratios=[1.3, 1])
    bars = df[df.kind == "task"]
    groups = list(dict.fromkeys(zip(bars.model, bars.context_tokens)))
    tasks = list(dict.fromkeys(bars.task))
    width = 0.8 / max(1, len(tasks))
    cmap = ["#2ca02c", "#98df8a", "#1f77b4", "#aec7e8", "#ff7f0e"]
    for k, task in enumerate(tasks):
        xs, ys = [], []
        for i, g in enumerate(groups):
            r = bars[(bars.model == g[0]) & (bars.context_tokens == g[1]) & (bars.task == task)]
            if len(r):
                xs.append(i + (k - (len(tasks) - 1) / 2) * width)
                ys.append(100 * r.hit_rate.iloc[0])
        h = a.bar(xs, ys, width, label=task, color=cmap[k % len(cmap)])
        a.bar_label(h, fmt="%.0f", fontsize=6, padding=1)
    a.axhline(100 * paper_value("fig16.ruler.128k.min_accuracy"), color="black", ls="--", lw=0.8,
              label="paper: >= 82.6% (RULER 128K, its models)")
    a.set_xticks(range(len(groups)), [f"{m}\n{fmt_tokens(int(c))}" for m, c in groups], fontsize=6)
    a.set_ylim(0, 125)
    a.set_xlabel("model and context (tokens)")
    a.set_ylabel("KV prediction accuracy (%)")
    a.set_title("(a) by model, context and task", fontsize=7)
    a.legend(fontsize=6, ncol=2, loc="upper center")
    lay = df[df.kind == "layer"]
    basis_rows = df[df.kind == "layer-basis"] if "kind" in df.columns else df.iloc[:0]
    for model, sub in lay.groupby("model", sort=False):
        sel_txt = sub.selection.iloc[0] if "selection" in sub.columns and isinstance(sub.selection.iloc[0], str) \
            else "T2, temperature 0.6"
        b.plot(sub.layer, 100 * sub.hit_rate, marker="o", ms=2.5, lw=1, color=SYSTEM_COLORS[DUALDECODER],
               label=f"hit, {sel_txt}")
        b.plot(sub.layer, 100 * sub.reuse_hit_rate, lw=1, ls="--", color=SYSTEM_COLORS[SHADOWKV],
               label=f"reuse (step t's own selection), {sel_txt}")
        basis = sub.lowrank_basis.iloc[0] if "lowrank_basis" in sub.columns else None
        bas = basis_rows[basis_rows.model == model]
        if len(bas):
            b.plot(bas.layer, 100 * bas.hit_rate, marker="s", ms=2, lw=1, color="#8c564b",
                   label=f"hit, summary basis: {basis}")
            low = bas[bas.lowrank == 1]
        else:
            low = sub[sub.lowrank == 1]
        thr = sub.lowrank_threshold.iloc[0]
        b.axhline(100 * thr, color="red", ls=":", lw=0.8)
        b.plot(low.layer, 100 * low.hit_rate, ls="none", marker="o", mfc="none", mec="red", ms=6,
               label=f"§5.3 low-rank layers {', '.join(str(int(x)) for x in low.layer)}: summary-basis hit below"
                     f" {thr:g} (dotted)" + ("" if len(bas) else f"; basis: {basis}"))
    b.set_ylim(0, 105)
    b.set_xlabel("layer (0-based index)")
    b.set_ylabel("hit and reuse rate (%)")
    b.set_title("(b) per layer", fontsize=7)
    b.legend(fontsize=5.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)
    fig.suptitle("Fig. 16: KV prediction accuracy measured on "
                 + ", ".join(f"{m} ({int(n)} layers)" for m, n in dict(zip(df.model, df.layers)).items())
                 + ", not the paper's models", fontsize=8)


@register("fig16", "KV prediction accuracy by model and context (paper Figure 16)", _draw_fig16)
def fig16() -> FigureResult:
    models = profiled_models("fig16")
    rows = []
    worst = None
    for model in models:
        df0 = _rows(model)
        full = profile_rates(model)
        low = set(_summary(model)["lowrank_layers"].get("layers", []))
        lr_m = _summary(model)["lowrank_layers"]
        per_layer = _summary(model).get("per_layer") or {}
        short = f"T2, temperature {full.selection.split('temperature ')[1].split(',')[0]}" \
            if "temperature " in full.selection else full.selection
        if full.budgets:
            short += f", budget {'/'.join(str(int(x)) for x in full.budgets)}"
        for ctx in sorted(df0.context_tokens.unique()):
            for task in sorted(df0.task.unique()):
                p = profile_rates(model, context=int(ctx), task=str(task))
                rows.append({"kind": "task", "model": model, "layers": _layers(model), "context_tokens": int(ctx),
                             "task": task, "layer": None, "hit_rate": p.hit_mean, "reuse_hit_rate": p.reuse_mean,
                             "lowrank": None})
                if worst is None or p.hit_mean < worst[0]:
                    worst = (p.hit_mean, model, int(ctx), task)
        for i, (h, r) in enumerate(zip(full.hit, full.reuse)):
            rows.append({"kind": "layer", "model": model, "layers": _layers(model), "context_tokens": None,
                         "task": "all", "layer": i, "hit_rate": h, "reuse_hit_rate": r, "lowrank": int(i in low),
                         "lowrank_threshold": lr_m.get("threshold"), "lowrank_basis": lr_m.get("basis"),
                         "selection": short})
        # the per-layer means the summary's low-rank set was chosen on (its basis), when the summary has them
        if per_layer.get("rows") and per_layer.get("basis") == lr_m.get("basis"):
            for r in sorted(per_layer["rows"], key=lambda x: int(x["layer"])):
                rows.append({"kind": "layer-basis", "model": model, "layers": _layers(model), "context_tokens": None,
                             "task": "all", "layer": int(r["layer"]), "hit_rate": float(r["hit_rate"]),
                             "reuse_hit_rate": float(r.get("reuse_hit_rate", float("nan"))),
                             "lowrank": int(int(r["layer"]) in low), "lowrank_threshold": lr_m.get("threshold"),
                             "lowrank_basis": lr_m.get("basis"), "selection": lr_m.get("basis")})
    df = pd.DataFrame(rows)
    m0 = models[0]
    lr = _summary(m0)["lowrank_layers"]
    where = f"lowest over {len(df[df.kind == 'task'])} (model, context, task) means: {worst[1]} {fmt_tokens(worst[2])} {worst[3]}"
    cmp = [Comparison("fig16.ruler.128k.min_accuracy", round(worst[0], 3),
                      f"{_caveat(worst[1])}; {where}; {profile_rates(worst[1]).selection.split(', context')[0]}; the paper"
                      f" tracks NIAH-1/2 of RULER at 128K"),
           Comparison("fig16.ruler.128k.miss_share", round(1 - worst[0], 3),
                      f"1 - the lowest mean above ({where}); {_caveat(worst[1])}")]
    setup = (f"{_caveat(m0)}; {profile_rates(m0).selection}; panel (b): per-layer means at that selection over every context"
             f" and task, and (where the summary has them) the per-layer means on the summary's basis, on which"
             f" §5.3's low-rank set is chosen (threshold {lr.get('threshold')}, basis {lr.get('basis')}: layers"
             f" {', '.join(str(x) for x in lr.get('layers', [])) or 'none'})")
    return FigureResult(df, setup, cmp)


# ---------------------------------------------------------------- Table 1
def _table1_frame(model: str) -> pd.DataFrame:
    rows = []
    for r in _summary(model)["task_accuracy"]:
        try:
            rows.append({"model": model, "context_tokens": int(r["context_tokens"]), "task": str(r["task"]),
                         "method": str(r["method"]),
                         "budget_tokens": None if r.get("budget_tokens") is None else int(r["budget_tokens"]),
                         "correct": int(r["correct"]), "total": int(r["total"]), "accuracy": float(r["accuracy"])})
        except (KeyError, TypeError, ValueError) as exc:
            raise DDBenchError(f"malformed accuracy summary {profile_path(model, 'summary')}: field task_accuracy:"
                               f" {exc}") from None
    if not rows:
        raise DDBenchError(f"table1: {profile_path(model, 'summary')} has no task accuracy (profile without --no-quality)")
    return pd.DataFrame(rows)


def _draw_table1(res: FigureResult, fig) -> None:
    df = res.data
    ours = df[df.source == "ours"]
    n_ours = ours.groupby(["context_tokens", "task"]).ngroups
    fig.set_size_inches(7.5, 2.5 + 0.22 * n_ours)
    a, b = fig.subplots(2, 1, height_ratios=[n_ours + 1.5, 6.5])
    for ax in (a, b):
        ax.axis("off")
    cols = [("dense", None)] + [(m, int(bud)) for bud in sorted(ours.budget_tokens.dropna().unique())
                                for m in ("sparse", "lowrank")]
    head = ["context", "task"] + ["dense" if m == "dense" else f"{'top-k' if m == 'sparse' else 'low-rank'}\n{bud}"
                                  for m, bud in cols]
    cells = []
    for (ctx, task), sub in ours.groupby(["context_tokens", "task"], sort=True):
        line = [fmt_tokens(int(ctx)), task]
        for m, bud in cols:
            r = sub[(sub.method == m) & ((sub.budget_tokens == bud) if bud else sub.budget_tokens.isna())]
            line.append(f"{r.accuracy.iloc[0]:.2f} ({int(r.correct.iloc[0])}/{int(r.total.iloc[0])})" if len(r) else "-")
        cells.append(line)
    t = a.table(cellText=cells, colLabels=head, loc="upper center", cellLoc="center")
    t.auto_set_font_size(False)
    t.set_fontsize(6.5)
    t.scale(1, 1.25)
    for (row, _col), cell in t.get_celld().items():
        if row == 0:
            cell.set_height(cell.get_height() * 1.9)
    model = ours.model.iloc[0]
    dense_low = ours[(ours.method == "dense") & (ours.accuracy < 1)]
    a.set_title(f"ours: {_who(model)}, task accuracy (exact match of the answer), {int(ours.total.max())} prompt(s)"
                f" per cell;\ncolumns: top-k = sparse exact top-k, low-rank = low-rank-K selection, each over the budget in"
                f" tokens below its name" + (
                    f";\ndense attention already below 1 on: {', '.join(sorted(set(dense_low.task)))}"
                    if len(dense_low) else ""), fontsize=7)
    pap = df[df.source == "paper"]
    pcells = []
    for task in dict.fromkeys(pap.task):
        line = [task]
        for ctx in ("64K", "128K"):
            for design in (SHADOWKV, DUALDECODER):
                r = pap[(pap.task == task) & (pap.context == ctx) & (pap.method == design)]
                line.append(f"{r.accuracy.iloc[0]:.2f}" if len(r) else "-")
        pcells.append(line)
    t2 = b.table(cellText=pcells, colLabels=["task", "64K ShadowKV", "64K DualDecoder", "128K ShadowKV",
                                             "128K DualDecoder"], loc="upper center", cellLoc="center")
    t2.auto_set_font_size(False)
    t2.set_fontsize(6.5)
    t2.scale(1, 1.2)
    b.set_title("paper (Table 1): Llama-3-8B-Instruct-Gradient-1048k, budget 1024, RULER; its Avg row is not the"
                " mean of its column", fontsize=7)
    fig.suptitle("Table 1: dense against sparse exact top-k (DualDecoder) against low-rank-key selection (ShadowKV)",
                 fontsize=8)


@register("table1", "Task accuracy: dense, sparse exact top-k, low-rank-key selection (paper Table 1)", _draw_table1)
def table1() -> FigureResult:
    model = profiled_models("table1")[0]
    ours = _table1_frame(model)
    ours["source"] = "ours"
    ours["context"] = ours.context_tokens.map(lambda c: fmt_tokens(int(c)))
    from ddbench.core.paper_numbers import reported
    rep = reported()
    prow = []
    for task in list(TABLE1_TASKS) + ["avg"]:
        for ctx in ("64k", "128k"):
            for design in (SHADOWKV, DUALDECODER):
                pid = f"table1.{task}.{ctx}.{design}"
                if pid in rep:
                    prow.append({"source": "paper", "model": "Llama-3-8B-Instruct-Gradient-1048k", "task": task,
                                 "context": ctx.upper(), "method": design, "budget_tokens": 1024,
                                 "accuracy": rep[pid].value, "paper_id": pid})
    df = pd.concat([ours, pd.DataFrame(prow)], ignore_index=True)
    top = int(ours.context_tokens.max())
    budgets = sorted(ours.budget_tokens.dropna().unique())
    bud = 1024 if 1024 in budgets else int(budgets[0])
    at = ours[(ours.context_tokens == top)]
    cmp = []
    if bud == 1024 and "table1.budget_tokens" in rep:
        cmp.append(Comparison("table1.budget_tokens", bud, f"budget of the sparse runs compared below; also measured:"
                                                           f" {', '.join(str(int(b)) for b in budgets if b != bud) or 'none'}"))
    dense = {r.task: r for r in at[at.method == "dense"].itertuples()}
    for ptask, task in TABLE1_TASKS.items():
        for design, method in TABLE1_SYSTEMS.items():
            r = at[(at.task == task) & (at.method == method) & (at.budget_tokens == bud)] if task else at.iloc[:0]
            for ctx in ("64k", "128k"):
                pid = f"table1.{ptask}.{ctx}.{design}"
                if pid not in rep or r.empty:
                    continue
                x = r.iloc[0]
                d = dense.get(task)
                cmp.append(Comparison(pid, round(float(x.accuracy), 3),
                                      f"ours: synthetic '{task}' task at {fmt_tokens(top)} (the paper: {ptask} at"
                                      f" {ctx.upper()}), {'low-rank keys (rank ' + str(_summary(model)['config'].get('rank', '?')) + ')' if method == 'lowrank' else 'exact top-k'}"
                                      f" selection, budget {bud}: {int(x.correct)}/{int(x.total)} prompt(s) correct"
                                      + (f"; dense {int(d.correct)}/{int(d.total)}" if d is not None else "")
                                      + f"; {_who(model)}"))
    for design, method in TABLE1_SYSTEMS.items():
        sub = at[(at.method == method) & (at.budget_tokens == bud)]
        if sub.empty:
            continue
        for ctx in ("64k", "128k"):
            pid = f"table1.avg.{ctx}.{design}"
            if pid in rep:
                dn = at[at.method == "dense"]
                cmp.append(Comparison(pid, round(float(sub.accuracy.mean()), 3),
                                      f"mean over our {len(sub)} tasks ({', '.join(sub.task)}) at {fmt_tokens(top)},"
                                      f" budget {bud}, {int(sub.total.sum())} prompts; dense attention:"
                                      f" {dn.accuracy.mean():.3f}; {_who(model)}"))
    setup = (f"{_caveat(model)}; task accuracy from traces/accuracy/{model}.summary.json (dense, sparse exact top-k and low-rank"
             f" keys over budgets {', '.join(str(int(b)) for b in budgets)}); paper tasks mapped to ours: "
             + ", ".join(f"{p} -> {t or 'none'}" for p, t in TABLE1_TASKS.items()) + f" (profiled: {', '.join(sorted(set(at.task)))})")
    return FigureResult(df, setup, cmp)
