"""Per-layer hit and reuse rates: a measured accuracy profile (traces/accuracy/<model>.csv), or a constant.

The profile is what `ddbench profile --layer-accuracy` writes: one row per (layer, context_tokens,
task, init, temperature) with, among others,
  layer           0-based
  hit_rate        share of step t+1's true chunk selection that the speculative token at step t
                  predicted (DualDecoder's prefetch)
  reuse_hit_rate  share that step t's own selection already holds (ShadowKV's reuse); optional,
                  without it the reuse rate equals the hit rate
  n               observations behind the row (optional; rows are weighted by it when present)
  context_tokens, task, init, temperature, budget_tokens   the axes rows are filtered on (each optional)
  model           provenance (optional): the model measured (else the file name)
The layer count is the highest layer + 1. Rows are validated by the core schema
(ddbench.core.schemas.AccuracyRow); lines starting with '#' are skipped, extra columns ignored. A
malformed file raises DDBenchError with one line naming the file, the line and the field.

Which rows are used (`Select`, written into the note that ends up in every output):
  init         't2' by default: the first speculative token is the pre-decoded T2 (§4.1)
  temperature  0.6 by default: the output token is sampled at 0.6 (ShadowKV's own benchmark
               setting; the speculative token is the argmax). Under greedy decoding with the T2
               start the speculative token is the next output token by construction and every
               hit is 1.0, so temperature 0 would say nothing
  context, task  None by default: all, averaged (n-weighted)
  budget       the smallest budget_tokens measured by default: a short profiled context (4K) with a
               large budget selects a large share of all chunks (2048 of 4096 tokens is half), which
               inflates both rates; the smallest budget is the closest to the share that budget 2048
               selects at 128K (1.6%). The note gives the budget and the share of the context
A column the file does not have is not filtered on, and the note says so; a filter value the file
has no rows for is an error that lists what it has.

A profile measured on a model with a different layer count is applied to another model only when
named explicitly (`resolve(PATH, ...)`, `ddbench simulate --hit-rate PATH`): layer j of the target
takes the source layer at the same relative depth, floor((j + 0.5) * L / L'), and the note says
"measured on <model> (<L> layers), mapped by relative depth onto <target> (<L'> layers)". The
default lookup (traces/accuracy/<model>.csv for the simulated model) refuses a profile whose layer
count differs from the model's.

The low-rank-key layer set (§5.3: layers whose prediction accuracy is consistently low) comes from
the profile's summary JSON (`lowrank_from_summary`: its `lowrank_layers` {rule, threshold, basis,
layers} and `shape.layers`, see ddbench/profile/trace.py), or from a threshold on the per-layer hit
rates (`lowrank_by_threshold`). The summary is read by `read_summary`, the one typed loader that
`simulate --lowrank-layers profile` and the figures use: a file that is not UTF-8 JSON, or a field of
the wrong type, is a one-line error naming the file (and the line, or the field).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ddbench.core import defaults as D
from ddbench.core.errors import DDBenchError
from ddbench.core.io import read_json_object
from ddbench.core.paths import traces_dir

PAPER_HIT = D.HIT_RATE    # the paper's average KV prediction accuracy (§4.1)
DEFAULT_INIT = D.PROFILE_INIT
DEFAULT_TEMPERATURE = D.PROFILE_TEMPERATURE
SMALLEST = -1             # Select.budget: the smallest budget the profile measured


@dataclass(frozen=True)
class Select:
    """Which profile rows to average. None: every value the file has."""
    init: str | None = DEFAULT_INIT
    temperature: float | None = DEFAULT_TEMPERATURE
    context: int | None = None
    task: str | None = None
    budget: int | None = SMALLEST     # SMALLEST: the smallest budget_tokens the file has; None: all


@dataclass(frozen=True)
class HitRates:
    path: str
    model: str                # the model measured (provenance column `model`, else the file name)
    layers: int               # its layer count
    hit: tuple                # per layer of the measured model
    reuse: tuple
    token_acc: float | None   # n-weighted mean over the rows used, if the file has token_acc
    rows: int                 # rows used
    selection: str            # which rows, in words
    contexts: tuple = ()      # context_tokens, task and budget_tokens values of the rows used
    tasks: tuple = ()
    budgets: tuple = ()

    @property
    def hit_mean(self) -> float:
        return sum(self.hit) / len(self.hit)

    @property
    def reuse_mean(self) -> float:
        return sum(self.reuse) / len(self.reuse)


def constant(rate: float, layers: int) -> list[float]:
    if not 0.0 <= rate <= 1.0:
        raise DDBenchError(f"hit rate must be within [0, 1], got {rate}")
    return [float(rate)] * layers


# ---------------------------------------------------------------- reading
def _extra(r, col: str):
    """A column the schema does not type (init, task, model, token_acc), stripped, or None."""
    v = (r.model_extra or {}).get(col)
    return v.strip() if isinstance(v, str) and v.strip() else None


def _describe(sel: Select, header: set, contexts: list, tasks: list, budgets: list = ()) -> str:
    parts = []
    for col, val, what in (("init", sel.init, "init"), ("temperature", sel.temperature, "temperature")):
        if col not in header:
            parts.append(f"no {what} column")
        elif val is None:
            parts.append(f"every {what}")
        else:
            parts.append(f"{what} {val:g}" if isinstance(val, float) else f"{what} {val}")
    ctx = "/".join(str(c) for c in contexts)
    parts.append(f"context {sel.context}" if sel.context is not None else
                 (f"contexts {ctx} averaged" if len(contexts) > 1 else f"context {ctx}") if contexts else
                 "no context column")
    parts.append(f"task {sel.task}" if sel.task is not None else
                 (f"tasks {', '.join(tasks)} averaged" if len(tasks) > 1 else f"task {tasks[0]}") if tasks else
                 "no task column")
    if budgets:
        share = "/".join(f"{b / c:.0%}" for c in contexts for b in budgets) if contexts else ""
        parts.append(f"budget {'/'.join(map(str, budgets))}" + (f" ({share} of the context)" if share else "")
                     + (" (the smallest measured)" if sel.budget == SMALLEST else ""))
    elif "budget_tokens" not in header:
        parts.append("no budget column")
    return ", ".join(parts)


def read_hitrates(path: str, sel: Select = Select()) -> HitRates:
    """The per-layer n-weighted means of the rows `sel` picks. Rows are validated by the core schema
    (ddbench.core.schemas.AccuracyRow): a defect is one line naming the file, the line and the field."""
    from ddbench.core.schemas import AccuracyRow, read_csv
    path = str(path)
    rows = read_csv(path, AccuracyRow, what="accuracy profile")
    has = set(AccuracyRow.model_fields) - {"reuse_hit_rate", "n", "context_tokens", "budget_tokens", "temperature"}
    for col in ("reuse_hit_rate", "n", "context_tokens", "budget_tokens", "temperature"):
        if any(getattr(r, col) is not None for r in rows):
            has.add(col)
    for col in ("init", "task", "model", "token_acc"):
        if any(_extra(r, col) is not None for r in rows):
            has.add(col)
    for col in ("init", "temperature", "context_tokens", "task", "budget_tokens"):
        if col in has and any((getattr(r, col, None) if col in AccuracyRow.model_fields else _extra(r, col)) is None
                              for r in rows):
            raise DDBenchError(f"malformed accuracy profile {path}: field {col}: blank in some rows, set in others")

    def value(r, col):
        return getattr(r, col) if col in AccuracyRow.model_fields else _extra(r, col)

    def match(r, col, val) -> bool:
        if val is None or col not in has:
            return True
        v = value(r, col)
        return abs(v - val) <= 1e-9 if col == "temperature" else v == val

    want = (("init", sel.init), ("temperature", sel.temperature), ("context_tokens", sel.context), ("task", sel.task))
    used = [r for r in rows if all(match(r, c, v) for c, v in want)]
    budget = sel.budget
    if "budget_tokens" in has and used and budget is not None:
        if budget == SMALLEST:
            budget = min(r.budget_tokens for r in used)
        used = [r for r in used if r.budget_tokens == budget]
    if not used:
        for col, val in want + (("budget_tokens", budget),):
            if val is not None and col in has and not any(match(r, col, val) for r in rows):
                vals = sorted({f"{value(r, col):g}" if isinstance(value(r, col), float) else str(value(r, col))
                               for r in rows})
                raise DDBenchError(f"accuracy profile {path} has no rows for {col} {val} (it has {', '.join(vals)})")
        raise DDBenchError(f"accuracy profile {path} has no rows for this combination: {sel}")

    names = {_extra(r, "model") for r in rows} - {None}
    if len(names) > 1:
        raise DDBenchError(f"malformed accuracy profile {path}: field model: several models ({', '.join(sorted(names))})")
    model = names.pop() if names else os.path.basename(path).removesuffix(".csv")

    acc: dict[int, list] = {}
    tok = [0.0, 0.0]
    for r in used:
        n = r.n if r.n is not None else 1.0
        acc.setdefault(r.layer, []).append((r.hit_rate, r.reuse_hit_rate if r.reuse_hit_rate is not None
                                            else r.hit_rate, n))
        t = _extra(r, "token_acc")
        if t is not None:
            try:
                tv = float(t)
            except ValueError:
                raise DDBenchError(f"malformed accuracy profile {path}: field token_acc: {t!r} is not a number") from None
            tok[0] += n * tv
            tok[1] += n
    L = max(r.layer for r in rows) + 1
    missing = [i for i in range(L) if i not in acc]
    if missing:
        raise DDBenchError(f"malformed accuracy profile {path}: field layer: no rows for layers {missing[:8]}"
                           f" (with {_describe(sel, has, [], [])})")

    def mean(i, k):
        w = sum(x[2] for x in acc[i])
        if w <= 0:
            return sum(x[k] for x in acc[i]) / len(acc[i])
        return sum(x[k] * x[2] for x in acc[i]) / w
    contexts = sorted({r.context_tokens for r in used}) if "context_tokens" in has else []
    tasks = sorted({_extra(r, "task") for r in used}) if "task" in has else []
    budgets = sorted({r.budget_tokens for r in used}) if "budget_tokens" in has else []
    return HitRates(path, model, L, tuple(mean(i, 0) for i in range(L)), tuple(mean(i, 1) for i in range(L)),
                   tok[0] / tok[1] if tok[1] else None, len(used), _describe(sel, has, contexts, tasks, budgets),
                   tuple(contexts), tuple(tasks), tuple(budgets))


# ---------------------------------------------------------------- applying to a simulated model
from ddbench.core.rates import map_depth  # noqa: E402,F401  (one definition; re-exported here)


def apply(prof: HitRates, target: str, target_layers: int, explicit: bool) -> tuple[list[float], list[float], str]:
    """(hit, reuse, note) of `prof` for a `target_layers`-layer model; a different layer count needs `explicit`."""
    head = f"accuracy profile {prof.path}: measured on {prof.model} ({prof.layers} layers)"
    tail = (f"; {prof.selection}; hit mean {prof.hit_mean:.3f} (min {min(prof.hit):.3f}, max {max(prof.hit):.3f}),"
            f" reuse mean {prof.reuse_mean:.3f}")
    if prof.layers == target_layers:
        same = prof.model.lower() == target.lower()
        return list(prof.hit), list(prof.reuse), head + ("" if same else f", applied to {target}") + tail
    if not explicit:
        raise DDBenchError(f"accuracy profile {prof.path} was measured on {prof.model} ({prof.layers} layers) but"
                           f" {target} has {target_layers}; name it with --hit-rate PATH to map it by relative depth")
    return (map_depth(prof.hit, target_layers), map_depth(prof.reuse, target_layers),
            head + f", mapped by relative depth onto {target} ({target_layers} layers)" + tail)


def load_hitrates(path: str, layers: int, sel: Select = Select(), target: str | None = None):
    """(hit, reuse, note) per layer of a `layers`-layer model from a profile CSV named explicitly."""
    prof = read_hitrates(path, sel)
    return apply(prof, target or prof.model, layers, explicit=True)


def default_path(model_name: str) -> str:
    return str(traces_dir("accuracy", f"{model_name}.csv"))


def resolve(spec: str | float | None, model_name: str, layers: int, default: float = PAPER_HIT,
            sel: Select = Select()):
    """(hit, reuse, note) per layer. `spec`: None (the model's own traces/accuracy/<model>.csv if present,
    else `default`), a number, or a CSV path (mapped by relative depth where the layer counts differ)."""
    if spec is None:
        path = default_path(model_name)
        if os.path.exists(path):
            return apply(read_hitrates(path, sel), model_name, layers, explicit=False)
        h = constant(default, layers)
        return h, h, (f"constant hit rate {default} (no traces/accuracy/{model_name}.csv; the paper's"
                      f" average KV prediction accuracy, §4.1)")
    if isinstance(spec, (int, float)):
        h = constant(float(spec), layers)
        return h, h, f"constant hit rate {float(spec)}"
    if not str(spec).strip():
        raise DDBenchError("the hit rate is empty: give a number in [0, 1] or an accuracy CSV")
    try:
        rate = float(spec)
    except ValueError:
        return load_hitrates(spec, layers, sel, target=model_name)
    h = constant(rate, layers)
    return h, h, f"constant hit rate {rate}"


# ---------------------------------------------------------------- low-rank key layers (§5.3)
def summary_path(csv_path: str) -> str:
    return str(csv_path)[:-4] + ".summary.json" if str(csv_path).endswith(".csv") else str(csv_path)


def lowrank_by_threshold(hit, threshold: float) -> frozenset:
    """§5.3's rule on per-layer hit rates: the layers whose prediction accuracy is below `threshold`."""
    return frozenset(i for i, h in enumerate(hit) if h < threshold)


def _summary_error(path: str, field: str, what: str) -> DDBenchError:
    return DDBenchError(f"malformed accuracy summary {path}: field {field}: {what}")


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def read_summary(path: str) -> dict:
    """An accuracy profile's summary (<model>.summary.json, ddbench/profile/trace.py) as a checked dict:
    a JSON object whose `model` (where given) is a name, `shape.layers` a layer count, `lowrank_layers`
    {layers: integers in 0..layers-1, threshold: a number, where given}, and `task_accuracy` (where
    given) a list of records. One-line DDBenchError naming the file (and the line or the field) otherwise."""
    import math
    path = str(path)
    doc = read_json_object(path, "accuracy summary", missing="`ddbench profile` writes it beside <model>.csv")
    if "model" in doc and not (isinstance(doc["model"], str) and doc["model"].strip()):
        raise _summary_error(path, "model", "not a name")
    shape = doc.get("shape")
    L = shape.get("layers") if isinstance(shape, dict) else None
    if not _count(L) or L < 1:
        raise _summary_error(path, "shape.layers", f"{L!r} is not a layer count")
    lr = doc.get("lowrank_layers")
    if not isinstance(lr, dict) or not isinstance(lr.get("layers"), list):
        raise _summary_error(path, "lowrank_layers.layers", "missing or not a list")
    if not all(_count(x) for x in lr["layers"]):
        raise _summary_error(path, "lowrank_layers.layers", "not integers")
    if any(not 0 <= x < L for x in lr["layers"]):
        raise _summary_error(path, "lowrank_layers.layers", f"outside 0..{L - 1}")
    t = lr.get("threshold")
    if "threshold" in lr and not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)):
        raise _summary_error(path, "lowrank_layers.threshold", f"{t!r} is not a number")
    for key in ("rule", "basis"):
        if key in lr and not isinstance(lr[key], str):
            raise _summary_error(path, f"lowrank_layers.{key}", "not text")
    ta = doc.get("task_accuracy")
    if "task_accuracy" in doc and not (isinstance(ta, list) and all(isinstance(a, dict) for a in ta)):
        raise _summary_error(path, "task_accuracy", "not a list of records")
    return doc


def lowrank_from_summary(path: str, target_layers: int | None = None, target: str | None = None,
                         explicit: bool = True) -> tuple[frozenset, str]:
    """(layer set, note): the low-rank-key layers the profile's summary picked by §5.3's rule, mapped by
    relative depth onto a `target_layers`-layer model where the counts differ (a target layer keeps
    low-rank keys where its source layer does)."""
    path = summary_path(path)
    doc = read_summary(path)
    lr, L = doc["lowrank_layers"], doc["shape"]["layers"]
    layers = sorted(lr["layers"])
    model = str(doc.get("model") or os.path.basename(path).removesuffix(".summary.json"))
    rule = str(lr.get("rule") or "§5.3 rule") + (f", threshold {lr['threshold']}" if "threshold" in lr else "") \
        + (f"; basis {lr['basis']}" if lr.get("basis") else "")
    note = f"low-rank key layers from {path} ({rule}): measured on {model} ({L} layers)"
    if target_layers is None or target_layers == L:
        return frozenset(layers), note + f": {layers}"
    if not explicit:
        raise DDBenchError(f"accuracy summary {path} was measured on {model} ({L} layers) but {target or 'the model'}"
                           f" has {target_layers}; name it explicitly to map it by relative depth")
    src = set(layers)
    mapped = sorted(j for j in range(target_layers) if min(L - 1, int((j + 0.5) * L / target_layers)) in src)
    return frozenset(mapped), note + (f" {layers}, mapped by relative depth onto {target or 'the target'}"
                                      f" ({target_layers} layers): {mapped}")
