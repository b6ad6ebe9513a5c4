"""The engine sweep's `paper` phase: the paper's own points (Figs. 2, 3, 12 and 14), measured.

    python -m ddbench.kernels.engine.sweep --phases paper --model qwen2.5-32b --contexts 64k,128k,256k \
        --gpu-mem-cap h100-80gb [--reps 3] [--max-batch 4096] [--budget-s 400]

For one model, every context of --contexts and each design of DESIGNS: the largest batch that fits
under the GPU memory cap, found by search_largest (doubling from batch 1, then the batch the memory
prediction puts largest, then bisection where the prediction was wrong), each batch tried a full
engine point with transfers on (kernels/engine/points.run_point: --reps timed CUDA-graph replays of two
steps each, min / median / max). The batches the search measured are the throughput-against-batch
series (Figs. 2, 3); every row has the GPU memory at its peak by category (Fig. 14) and the memory
model's largest batch for the same point (ddbench.core.memory.max_batch).

The cap (--gpu-mem-cap GB, or a catalog GPU's memory: h100-80gb) emulates a smaller GPU: the CUDA
context and cuBLAS (measured at start, outside torch's allocator) count against it, torch's allocator
is limited to the rest (torch.cuda.set_per_process_memory_fraction), and a batch whose planned bytes
(the weights and the engine's own tensors, ddbench.kernels.engine.engine.plan_bytes) exceed that limit is
refused before anything is allocated. A batch "does not fit" only where its plan is over the limit
or where it ran out of memory (in building, the eager steps, the CUDA-graph capture or the replays:
the row's `error` says where). The plan leaves out the step's transient work and the graph's private
pool (0.2-1.1 GiB measured at 128K): they are not refused on an estimate, they are measured.

Failures: a point that raises is a row and the phase goes on (`oom` where the exception's chain is an
out-of-memory error, e.g. one raised inside the capture: "does not fit"; else `error`, which ends that
design's search). The capture joins its side streams before an exception leaves it
(kernels/engine/capture.py), so a capture that runs out of memory leaves torch usable; after every
point that is not `ok` the GPU state is checked (capture.gpu_health) and, where it is unusable, every
later point of the process reads `error` (not run) instead of a wrong `oom`. A model whose weights
fail is rows of its own (kernels/engine/phases.py) and the next point runs.

Host KV: a --host-gib pinned buffer viewed by ddbench.kernels.layout.host_kv_view; a point whose host KV
exceeds it reads aliased layers, then aliased requests (rows say which: host_alias). Every chunk
still crosses the link; only the values repeat.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ddbench.core.designs import DUALDECODER, FULL_KV, SHADOWKV, SPECACHE, cache_designs, get_design
from ddbench.core.errors import DDBenchError
from ddbench.core.rates import prediction_of
from ddbench.kernels.engine.points import Label, design_labels, design_spec

PAPER = "paper"
DESIGNS = (DUALDECODER, SHADOWKV, SPECACHE, FULL_KV)   # the headline pair first (budget cuts the tail)
DEFAULT_CONTEXTS = (131072,)
QUICK = dict(contexts=(32768,), max_batch=4)                     # --quick: a smoke of the phase
MAX_BATCH = 4096
POINT_FIXED_S = 3.0       # building an engine and capturing its graph, beside its steps (the time budget's estimate)
GIB = 1 << 30


class Stop(Exception):
    """The search of a design ends here; `basis` says why (time, host-limit, error)."""
    basis = "stopped"

    def __init__(self, basis=None):
        super().__init__(basis or self.basis)
        self.basis = basis or self.basis


class TimeUp(Stop):
    """The time budget leaves no room for the next point."""
    basis = "time"


# ------------------------------------------------------------------ the cap

def parse_cap(text: str | None) -> tuple[int | None, str]:
    """--gpu-mem-cap: GB (1e9 bytes) or a catalog GPU name (its memory) -> (bytes, label); None: no cap."""
    if text is None:
        return None, "none"
    try:
        gb = float(text)
    except ValueError:
        from ddbench.core.catalog.gpus import get_gpu
        try:
            g = get_gpu(text)
        except DDBenchError as exc:
            raise DDBenchError(f"--gpu-mem-cap takes GB or a catalog GPU name: {exc}") from None
        return g.hbm_bytes, g.name
    if not math.isfinite(gb) or gb <= 0:
        raise DDBenchError(f"--gpu-mem-cap must be a positive number of GB or a GPU name, got {text!r}")
    return int(gb * 1e9), f"{gb:g}gb"


def check_cap(cap: int | None, model, total: int | None = None) -> None:
    """One-line DDBenchError for a cap at or below the model's weights, or above the GPU's memory."""
    if cap is None:
        return
    from ddbench.kernels.engine.model import weight_bytes
    w = weight_bytes(model)
    if cap <= w:
        raise DDBenchError(f"--gpu-mem-cap {cap / 1e9:.1f} GB is not above {model.name}'s weights ({w / 1e9:.1f} GB)")
    if total is not None and cap > total:
        raise DDBenchError(f"--gpu-mem-cap {cap / 1e9:.1f} GB is above this GPU's memory ({total / 1e9:.1f} GB)")


def cap_gpu(cap: int | None, label: str, device_gpu: str):
    """The catalog GPU the memory model prices the point on: the named one, else this GPU with the cap."""
    from dataclasses import replace

    from ddbench.core.catalog.gpus import GPUS, get_gpu
    if label in GPUS:
        return GPUS[label]
    g = get_gpu(device_gpu) if device_gpu in GPUS else get_gpu("h200")
    return g if cap is None else replace(g, name=f"{g.name}-cap-{label}", hbm_bytes=cap)


def matched_rates(model, budget=None):
    """(context, design, cache_tokens) -> (miss, churn, note): a design's forced rates, the means over layers of
    the matched rate set (ddbench.core.rates: every design from one profile at this context, budget share and
    capacity): ShadowKV's and DualDecoder's misses (1 - reuse, 1 - hit), a chunk cache's urgent share (as its
    miss) and churn (None for lru-cache, which prefetches nothing); the note is the rate set's line, which every
    row of the design records (`rates_note`)."""
    from ddbench.core import defaults as D
    from ddbench.core.designs import DESIGNS
    from ddbench.core.rates import rate_set
    b = budget or D.BUDGET

    def rates(ctx, design, ct=None):
        rs = rate_set(model.name, model.num_layers, int(ctx), b, int(ct or D.CACHE_TOKENS), tuple(DESIGNS))
        dr = rs.of(design)
        if dr is None or dr.family is None:
            return None, None, ""
        if not dr.matched:
            raise DDBenchError(f"{design} at {ctx} tokens: no measured rates match ({dr.detail}); give --miss")
        first = dr.get("miss") or dr.get("urgent")
        churn = dr.get("churn")
        return round(first.mean(), 4), None if churn is None else round(churn.mean(), 4), dr.line()
    return rates


def profile_cache_rates(model, budget=None):
    """(context, cache_tokens, prediction) -> (urgent, churn, note) of a chunk-cache design (matched_rates)."""
    rates = matched_rates(model, budget)

    def cache(ctx, ct, prediction="speculative"):     # the first registered chunk-cache design of that prediction
        return rates(ctx, next(n for n in cache_designs() if prediction_of(get_design(n)) == prediction), ct)
    return cache


# ------------------------------------------------------------------ the search

@dataclass
class Search:
    largest: int              # 0: not even batch 1 fits
    basis: str                # why largest + 1 is not the answer: planned | oom | max-batch | time | host-limit | error
    tried: dict = field(default_factory=dict)   # batch -> bytes in use at its peak (fits) or None


def search_largest(measure, planned, limit: int, max_batch: int) -> Search:
    """The largest batch <= max_batch that fits in `limit` bytes.

    measure(B) -> bytes in use at the point's peak, or None where it ran out of memory (it may raise
    Stop, e.g. TimeUp: the search ends with the largest batch so far); planned(B) -> the bytes known
    before allocating, exact and increasing in B. A batch whose plan exceeds the limit is refused
    without measuring. Doubling from 1 (each batch measured: the series) while the prediction fits;
    then the largest batch the prediction fits, then its next one, and plain bisection once the
    prediction has been wrong. The prediction is planned(B) plus the workspace (in use - planned) of
    the two largest batches that fit, extended linearly."""
    tried: dict = {}

    def fits(B):
        if B not in tried:
            tried[B] = None if planned(B) > limit else measure(B)
        return tried[B] is not None

    def predict(B):
        ok = sorted(b for b, u in tried.items() if u is not None)[-2:]
        if not ok:
            return planned(B)
        ws = [tried[b] - planned(b) for b in ok]
        slope = max(0.0, (ws[1] - ws[0]) / (ok[1] - ok[0])) if len(ok) == 2 else 0.0
        return planned(B) + max(0.0, ws[-1] + slope * (B - ok[-1]))

    lo, hi = 0, max_batch + 1
    try:
        B = 1
        while B < hi:
            if not fits(B):
                hi = B
                break
            lo = B
            if 2 * B >= hi or predict(2 * B) > limit:
                break
            B *= 2
        guided = True
        while hi - lo > 1:
            if guided:
                a, b = lo, hi                         # the largest batch the prediction fits
                while b - a > 1:
                    m = (a + b) // 2
                    a, b = (m, b) if predict(m) <= limit else (a, m)
                cand, predicted = (a, True) if a > lo else (lo + 1, False)
            else:
                cand, predicted = (lo + hi) // 2, None
            ok = fits(cand)
            lo, hi = (cand, hi) if ok else (lo, cand)
            if predicted is not None and ok != predicted and planned(cand) <= limit:
                guided = False                        # the prediction was wrong: bisect
    except Stop as exc:
        return Search(lo, exc.basis, tried)
    if lo == max_batch:
        return Search(lo, "max-batch", tried)
    return Search(lo, "planned" if planned(hi) > limit else "oom", tried)


# ------------------------------------------------------------------ the phase

class Poisoned(Stop):
    """A failed point left the process's GPU state unusable (kernels/engine/capture.gpu_health, or a
    sticky error): no later point of the process runs (their rows read `error`, not run)."""
    basis = "error"


def paper_key(model, cap_label, ctx, design, batch=None, rep=0) -> str:
    """rows.jsonl keys: one per measured batch (and per repeated build: rep > 0), and a 'paper-done'
    marker per searched design."""
    if batch is None:
        return json.dumps(["paper-done", model, cap_label, ctx, design])
    return json.dumps([PAPER, model, cap_label, ctx, design, batch] + ([rep] if rep else []))


def stub_row(model: str, design: str, ctx: int, miss, *, cap_label, cap_gib, status, error=None, batch=1) -> dict:
    """A paper row without measurements (skipped, not run, failed before run_point returned): the columns
    engine.csv's reader needs."""
    r = dict(phase=PAPER, rep=0, model=model, design=design, context=ctx, batch=batch,
             miss_rate="none" if miss is None else miss, transfers=1, graph=1, urgent_programs=64,
             gpu_mem_cap=cap_label, cap_gib=cap_gib, status=status)
    if error:
        r["error"] = error
    return r


def not_run_rows(model: str, contexts, *, cap_label, cap_gib, miss_rate, status, error, designs=DESIGNS) -> list:
    """One row per context and design of a model whose points cannot run (its weights failed, or the GPU
    state was left unusable): `status` and `error` say why; largest batch 0, basis `error`."""
    rows = []
    for ctx in contexts:
        for d in designs:       # d: a design, or a label design@tokens[+fp8]
            label = Label.parse(d)
            r = stub_row(model, label.design, ctx, None if design_spec(d).kv_on_gpu else miss_rate,
                         cap_label=cap_label, cap_gib=cap_gib, status=status, error=error)
            r.update(largest_batch=0, largest_basis="error", paper_role="trial", kv_bits=label.kv_bits,
                     cache_bits=label.cache_bits)
            if d != label.design:
                r["design_label"] = d
            if label.cache_tokens is not None:
                r["cache_tokens"] = label.cache_tokens
            rows.append(r)
    return rows


@dataclass(frozen=True)
class PaperSearch:
    """What the paper phase searches and how (run_paper's docstring says what each does): the GPU memory
    cap, the forced miss rate, the largest batch tried or one fixed batch, the timed replays per point, the
    builds of the largest batch, the designs and their chunk-cache capacities and bits, the seed and the
    deadline (time.perf_counter)."""
    cap: int | None                 # bytes (None: no cap)
    cap_label: str
    miss_rate: float | None         # --miss: forced on every design; None: each its matched rates (matched_rates)
    deadline: float = math.inf
    reps: int = 3
    max_batch: int = MAX_BATCH
    fixed_batch: int | None = None
    repeats: int = 1
    designs: tuple = DESIGNS
    cache_tokens: tuple = (None,)
    cache_rates: object = None      # (context, tokens, prediction) -> (urgent, churn, note); None: profile_cache_rates
    kv_bits: tuple = (16,)
    cache_bits: tuple = (16,)
    seed: int = 0

    @property
    def cap_gib(self):
        return None if self.cap is None else self.cap / GIB


@dataclass(frozen=True)
class PaperJournal:
    """Where the paper phase's rows go: `done`, the rows.jsonl entries of an earlier run (--resume);
    `append(key, row)` records a row (row None: the done marker); `current(key)` names the point about to
    run (a crash leaves it behind)."""
    done: dict
    append: Callable
    current: Callable = lambda key: None


def run_paper(setup, contexts, search: PaperSearch, journal: PaperJournal, *, gpu_state=None, health=None,
              run_point=None):
    """Every design of search.designs at every context: search_largest on engine points, each run on
    `setup` (ddbench.kernels.engine.points.PointSetup: the model, its weights, the host buffer, the HBM rate
    and the memory limit). Returns the rows (the search's batches, each measured or refused, with the
    largest batch and its basis on every row of the design's search). A design already searched in
    journal.done is taken from it (--resume).

    A point that raises is a row, never the end of the phase: an out-of-memory error anywhere in its
    exception's chain (one raised inside the CUDA-graph capture included) is status `oom` with the
    planned bytes, and the search takes it as "does not fit"; any other exception is `error` and ends
    that design's search. After every point that is not `ok`, `health()` (capture.gpu_health: default)
    checks that the GPU state is still usable; where it is not, or the error is sticky, the reason goes
    into `gpu_state["poisoned"]` and this and every later point of the process is not run (`error`).

    fixed_batch: measure that batch only (no search: Fig. 14's batches), largest basis `fixed` where it
    fits. repeats: the largest (or fixed) batch is built and measured repeats - 1 more times, each a new
    engine (its host KV values and forced-miss draws seeded seed + rep): rows rep 1.., role `repeat`;
    the summary's min / median / max over them are over independent builds.

    designs: the designs searched (default DESIGNS); a chunk-cache design (dualdecoder-cache) is searched
    at each capacity of `cache_tokens` (its label `design@tokens`), with the forced rates
    cache_rates(context, tokens) -> (urgent, churn, note): the true chunks forced to miss the prediction
    and the prediction's churn (default: the matched rate set's, ddbench.core.rates). kv_bits (16, 8):
    each design that keeps its KV on the host is searched once more with an fp8 host KV (label + '+fp8');
    cache_bits (16, 8): with 8, a chunk-cache design with an fp8 host KV once more with an fp8 cache ('+fp8cache').

    run_point: one engine point (default ddbench.kernels.engine.points.run_point; a test passes a fake)."""
    from ddbench.kernels.engine import capture as cap_mod
    from ddbench.kernels.engine import points
    run = _PaperRun(setup=setup, search=search, journal=journal, gpu_state={} if gpu_state is None else gpu_state,
                    health=health or cap_mod.gpu_health,
                    cache_rates=search.cache_rates or profile_cache_rates(setup.model),
                    run_point=run_point or points.run_point)
    rows = []
    labels = design_labels(search.designs, search.cache_tokens, search.kv_bits, search.cache_bits)
    for ctx in contexts:
        for label in labels:
            rows += run.design_rows(ctx, label, journal.done)
    return rows


@dataclass
class _Design:
    """One label's search at one context: its design, capacity, bits and forced rates, the bytes resident
    before it (the weights), the (batch, step seconds) it measured and its rows as they are made."""
    ctx: int
    label: str
    design: str
    cache_tokens: int | None
    kv_bits: int
    cache_bits: int
    spec: object
    miss: float | None
    churn: float | None
    extra: dict                  # columns every row of the search carries (design_label, the cache's)
    base: int
    steps: list = field(default_factory=list)
    mine: list = field(default_factory=list)


@dataclass
class _PaperRun:
    """run_paper's context: the points' setup, the search, the journal, the GPU state and its check."""
    setup: object
    search: PaperSearch
    journal: PaperJournal
    gpu_state: dict
    health: object
    cache_rates: object
    run_point: object

    def key(self, ctx, label, batch=None, rep=0):
        return paper_key(self.setup.model.name, self.search.cap_label, ctx, label, batch, rep)

    def design_rows(self, ctx, label, done) -> list:
        """One label at one context: its rows from an earlier run (--resume), `error` rows where the GPU
        state is unusable, else its search; a search that raises keeps what it measured (basis error)."""
        if self.key(ctx, label) in done:
            prefix = self.key(ctx, label, 0)[:-2]
            return [e["row"] for k, e in done.items() if k.startswith(prefix) and e.get("row")]
        if self.gpu_state.get("poisoned"):
            rows = self._not_run(ctx, label, f"not run: the GPU state is unusable after {self.gpu_state['poisoned']}")
            for r in rows:
                self.journal.append(self.key(ctx, label, r["batch"]), r)
            return rows
        from ddbench.kernels.engine import capture as cap_mod
        mine = []
        try:
            self.search_label(ctx, label, mine)
        except Exception as exc:  # noqa: BLE001 - a failure outside a point (the search's own): a row
            import traceback
            self.setup.log(f"  [paper] {self.setup.model.name} {ctx // 1024}K {label}: the search failed\n"
                     + traceback.format_exc(limit=8))
            failure = cap_mod.classify(exc)
        else:
            return mine
        cap_mod.release()
        if not mine:
            mine = self._not_run(ctx, label, f"the search failed: {failure[1]}")
        ok = [r["batch"] for r in mine if r.get("status") == "ok"]
        for r in mine:                        # what it measured stands; why it stopped is on every row
            r.update(largest_batch=max(ok, default=0), largest_basis="error")
            r.setdefault("paper_role", "series" if r.get("status") == "ok" else "trial")
            self.journal.append(self.key(ctx, label, r["batch"]), r)
        return mine

    def _not_run(self, ctx, label, error):
        return not_run_rows(self.setup.model.name, (ctx,), cap_label=self.search.cap_label, cap_gib=self.search.cap_gib,
                            miss_rate=self.search.miss_rate, status="error", designs=(label,), error=error)

    def search_label(self, ctx, label, mine):
        """One label's search at one context: its rows, into `mine` as they are made."""
        s = self._design(ctx, label, mine)
        res = self._largest(s)
        if res.largest and res.basis not in ("error",):
            self._repeat(s, res.largest)
        self._close(s, res)

    def _design(self, ctx, label, mine) -> _Design:
        import gc

        import torch
        lb = Label.parse(label)
        gc.collect()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()      # the weights (and anything else resident)
        spec = design_spec(lb.design)
        miss = None if spec.kv_on_gpu else self.search.miss_rate
        churn, extra = None, ({} if label == lb.design else dict(design_label=label))
        if spec.chunk_cache:
            miss, churn, note = self.cache_rates(ctx, lb.cache_tokens, prediction_of(spec))
            extra.update(cache_tokens=lb.cache_tokens, churn_rate=churn, rates_note=note)
        elif miss is None and not spec.kv_on_gpu:       # the matched rate set's, not a forced constant
            miss, _, note = matched_rates(self.setup.model)(ctx, lb.design)
            extra.update(rates_note=note)
        return _Design(ctx, label, lb.design, lb.cache_tokens, lb.kv_bits, lb.cache_bits, spec, miss, churn, extra,
                       base, mine=mine)

    def _timing(self, s: _Design, rep=0):
        """How each point of the search runs: transfers on, graph replays, the search's reps, seed + rep."""
        from ddbench.kernels.engine.points import PointTiming
        return PointTiming(s.miss, reps=self.search.reps, seed=self.search.seed + rep)

    def _cfg(self, s: _Design, B, rep=0):
        """SpeCache holds its 2-bit values too: the design's whole residency."""
        from ddbench.kernels.engine.points import make_config
        return make_config(s.ctx, B, self._timing(s, rep), quant_values=True, cache_tokens=s.cache_tokens,
                           churn_rate=s.churn, kv_bits=s.kv_bits, cache_bits=s.cache_bits)

    def _planned(self, s: _Design, B):
        from ddbench.kernels.engine.engine import plan_bytes
        return s.base + sum(plan_bytes(self.setup.model, s.spec, self._cfg(s, B)).values())

    def _point(self, s: _Design, B, rep=0):
        """One engine point of the search (a failure is its row); the GPU state checked after one not ok."""
        from ddbench.kernels.engine import capture as cap_mod
        from ddbench.kernels.engine.points import check_gpu_state
        key = self.key(s.ctx, s.label, B, rep)
        self.journal.current(key)
        t0 = time.perf_counter()
        failure = None
        try:
            r = self.run_point(self.setup, s.design, s.ctx, B, self._timing(s, rep), cfg=self._cfg(s, B, rep))
        except Exception as exc:  # noqa: BLE001 - reported in the row; the phase goes on
            import traceback
            self.setup.log(f"  {s.design} ctx={s.ctx} B={B}: ERROR\n" + traceback.format_exc(limit=8))
            failure = cap_mod.classify(exc)
        # out of the except block: the exception (and the engine its frames hold) is gone
        if failure is not None:
            r = stub_row(self.setup.model.name, s.design, s.ctx, s.miss, cap_label=self.search.cap_label,
                         cap_gib=self.search.cap_gib, status=failure[0], error=failure[1], batch=B)
            r["planned_gib"] = self._planned(s, B) / GIB
        if r.get("status") != "ok":
            check_gpu_state(r, failure is not None and failure[2], self.gpu_state,
                            f"{self.setup.model.name} {s.design} {s.ctx // 1024}K B={B}", self.health,
                            lambda t: self.setup.log("  [paper] " + t))
        r.update(phase=PAPER, rep=rep, gpu_mem_cap=self.search.cap_label, cap_gib=self.search.cap_gib,
                 wall_s=time.perf_counter() - t0, **s.extra)
        s.mine.append(r)
        self.journal.append(key, r)
        return r

    def _estimate_s(self, s: _Design, B):
        """The next point's time: its step executions (pre-decode, warm-up, a warm-up replay and `reps`
        replays of 2 steps) at the last step time scaled by the batch, + building and capturing
        (compiles excluded: they fall on the first points)."""
        if not s.steps:
            return 0.0
        return POINT_FIXED_S + (4 + 2 * self.search.reps) * s.steps[-1][1] * B / s.steps[-1][0]

    def _measure(self, s: _Design, B):
        """search_largest's measure: bytes in use at the point's peak, None where it does not fit."""
        if time.perf_counter() + self._estimate_s(s, B) > self.search.deadline:
            raise TimeUp
        r = self._point(s, B)
        if self.gpu_state.get("poisoned"):
            raise Poisoned
        if r["status"] in ("host-limit", "error"):
            raise Stop(r["status"])
        if r["status"] != "ok":
            return None                           # oom (refused by its plan, or ran out): does not fit
        s.steps.append((B, r["step_ms"] / 1e3))
        return r["peak_reserved_gib"] * GIB

    def _largest(self, s: _Design) -> Search:
        """The searched largest batch, or with fixed_batch that batch alone (basis fixed where it fits)."""
        if self.search.fixed_batch is None:
            return search_largest(lambda B: self._measure(s, B), lambda B: self._planned(s, B), self.setup.limit,
                                  self.search.max_batch)
        try:
            ok = self._measure(s, self.search.fixed_batch) is not None    # refused by its plan or out of memory: None
            return Search(self.search.fixed_batch if ok else 0, "fixed" if ok else "oom")
        except Stop as exc:
            return Search(0, exc.basis)

    def _repeat(self, s: _Design, largest):
        """The largest batch built and measured again (repeats - 1 times) while time allows."""
        for rep in range(1, self.search.repeats):
            late = time.perf_counter() + self._estimate_s(s, largest) > self.search.deadline
            if late or self.gpu_state.get("poisoned"):
                break
            if self._point(s, largest, rep)["status"] != "ok" or self.gpu_state.get("poisoned"):
                break

    def _close(self, s: _Design, res: Search):
        """Every row of the search gets its largest batch, basis and role; a finished search its done marker."""
        if not s.mine and res.basis == "time":
            s.mine.append({**stub_row(self.setup.model.name, s.design, s.ctx, s.miss, cap_label=self.search.cap_label,
                                      cap_gib=self.search.cap_gib, status="skipped-time"), **s.extra})
        elif not s.mine:                          # batch 1 refused by its plan: its row says how far over
            self._point(s, 1)
        nxt = self._planned(s, res.largest + 1) / GIB
        for r in s.mine:
            r.update(largest_batch=res.largest, largest_basis=res.basis, next_planned_gib=nxt,
                     paper_role=("repeat" if r.get("rep") else
                                 "largest" if r["batch"] == res.largest and r["status"] == "ok" else
                                 "series" if r["status"] == "ok" else "trial"))
            self.journal.append(self.key(s.ctx, s.label, r["batch"], r.get("rep", 0)), r)
        if res.basis not in ("time", "error"):      # a resumed run searches these again
            self.journal.append(self.key(s.ctx, s.label), None)
        self.setup.log(f"  [paper] {self.setup.model.name} {s.ctx // 1024}K cap {self.search.cap_label}: {s.label}"
                       f" largest batch {res.largest} ({res.basis}; memory model {s.mine[0].get('model_max_batch')})")


def summarize(rows) -> list[dict]:
    """Per (model, cap, context, design): the largest batch and its tokens/s (min / median / max over
    replays), the memory model's largest batch, the series and the memory by category at the largest;
    where the largest was built more than once (repeats), `builds`: tokens/s of each build and their
    min / median / max."""
    import statistics
    out = {}
    for r in rows:
        if r.get("phase") != PAPER:
            continue
        k = (r.get("model"), r.get("gpu_mem_cap"), r["context"], r.get("design_label") or r["design"])
        e = out.setdefault(k, dict(model=k[0], gpu_mem_cap=k[1], context=k[2], design=k[3],
                                   largest_batch=r.get("largest_batch"), largest_basis=r.get("largest_basis"),
                                   model_max_batch=r.get("model_max_batch"), series=[], builds=[]))
        if r.get("status") in ("ok", "ok-no-twin") and r.get("step_ms"):
            if r.get("paper_role") in ("largest", "repeat"):
                e["builds"].append(dict(rep=r.get("rep", 0), tok_s=r["tok_s"], step_ms=r["step_ms"]))
            if r.get("paper_role") == "repeat":
                continue
            e["series"].append(dict(batch=r["batch"], tok_s=r["tok_s"], tok_s_min=r.get("tok_s_min"),
                                    tok_s_max=r.get("tok_s_max"), peak_gib=r.get("peak_gib")))
            if r.get("paper_role") == "largest":
                e["largest"] = {c: r.get(c) for c in r if c.startswith("mem_") or c in (
                    "tok_s", "tok_s_min", "tok_s_max", "step_ms", "peak_gib", "peak_reserved_gib", "planned_gib",
                    "link_gbps", "host_alias")}
    for e in out.values():
        e["series"].sort(key=lambda s: s["batch"])
        b = sorted(x["tok_s"] for x in e["builds"])
        if b:
            e["builds_tok_s"] = dict(n=len(b), min=b[0], median=statistics.median(b), max=b[-1])
    return list(out.values())
