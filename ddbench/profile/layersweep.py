"""The `ddbench profile --layer-accuracy` sweep: load once, prefill once per prompt, measure, write.

    ProfileConfig           every knob of the command (frozen)
    validate(cfg, model_cfg) -> {context: [budgets]}   bad input -> DDBenchError before any work
    run(cfg) -> dict        the sweep; writes traces (ddbench/profile/trace.py) at the very end

Per prompt (context x task x sample): one chunked dense prefill; exact landmarks of every layer;
for every init and temperature one dual-token run (ddbench/profile/decode.py) whose captured
queries are scored for every budget (ddbench/profile/selection.py, metrics.py); then the task
accuracy of dense, sparse exact top-k and low-rank-key attention (ddbench/profile/quality.py).
With cache capacities, each budget's selections also replay a GPU chunk cache (ddbench/profile/cache.py).
With fp8_error, every run's output-token queries also measure the attention-output error of fp8 K/V
against bf16 per layer, dense and over each budget's true selection (ddbench/profile/fp8error.py), and
task accuracy gains the method fp8 (exact top-k over fp8 K/V). With prompts, task accuracy runs on
`prompts` seeded prompts per (context, task) (the first `samples` of them also measure the rest) and
its rates, with Wilson 95 % intervals, also go to <model>.tasks.csv.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import asdict, dataclass

from ddbench.core.errors import DDBenchError
from ddbench.profile import loadmodel as model_mod
from ddbench.profile.quality import wilson
from ddbench.profile.selection import LOCAL_TOKENS, Geometry
from ddbench.profile.tasks import TASKS

METHODS = ("dense", "sparse", "lowrank")
ALL_METHODS = METHODS + ("fp8",)      # fp8: exact top-k over fp8 K/V (with --fp8-error)


@dataclass(frozen=True)
class ProfileConfig:
    model: str
    contexts: tuple = (4096,)
    tasks: tuple = ("single", "multikey", "vt")
    steps: int = 64
    budgets: tuple = (1024, 2048)
    chunk: int = 8
    local: int = LOCAL_TOKENS
    inits: tuple = ("t2", "random")
    temperatures: tuple = (0.0, 0.6, 1.0)
    top_p: float = 1.0
    seed: int = 0
    samples: int = 1
    rank: int = 160
    lowrank_threshold: float = 0.8
    quality: bool = True
    device: str = "auto"
    out: str | None = None
    force: bool = False       # replace this model's earlier traces (ddbench's own only)
    allow_extrapolation: bool = False
    progress: bool = True
    threads: int = 0          # torch CPU threads; 0 = torch's default
    cache_capacities: tuple = ()   # the chunk-cache replay (ddbench/profile/cache.py); () = off
    cache_policies: tuple = ("lru", "score")
    fp8_error: bool = False   # fp8 (e4m3) KV attention error against bf16 (ddbench/profile/fp8error.py) and
                              # the task accuracy of exact top-k over fp8 K/V (method "fp8")
    run_lengths: bool = False   # the true selections' run lengths (ddbench/profile/runlengths.py)
    prompts: int | None = None     # prompts per (context, task) for task accuracy (None: --samples); with it,
                                   # <model>.tasks.csv (rates with Wilson 95 % intervals)
    questions: int = 1        # questions per prompt sharing its haystack: one prefill serves them all
    indexes: tuple = ("flat",)   # the selection indexes (issue 47): every rate and the sparse task accuracy
                                 # under each, over the same prefill and queries (ddbench/profile/indexrates.py)
    command: str = ""


def validate(cfg: ProfileConfig, max_positions: int, sliding_window: int | None = None) -> dict:
    if cfg.steps < 1:
        raise DDBenchError(f"--steps must be at least 1, got {cfg.steps}")
    if cfg.samples < 1:
        raise DDBenchError(f"--samples must be at least 1, got {cfg.samples}")
    if cfg.questions < 1:
        raise DDBenchError(f"--questions must be at least 1, got {cfg.questions}")
    if cfg.prompts is not None and cfg.prompts < 1:
        raise DDBenchError(f"--prompts must be at least 1, got {cfg.prompts}")
    if not cfg.tasks or any(t not in TASKS for t in cfg.tasks):
        raise DDBenchError(f"unknown task in {','.join(cfg.tasks)}: choose from {', '.join(TASKS)}")
    if not cfg.inits or any(i not in ("t2", "random") for i in cfg.inits):
        raise DDBenchError("--init must be t2, random or both")
    if any(t < 0 for t in cfg.temperatures) or not cfg.temperatures:
        raise DDBenchError("--temperature values must be >= 0")
    if not 0 < cfg.top_p <= 1:
        raise DDBenchError(f"--top-p must be in (0, 1], got {cfg.top_p}")
    if not 0 <= cfg.lowrank_threshold <= 1:
        raise DDBenchError(f"--lowrank-threshold must be in [0, 1], got {cfg.lowrank_threshold}")
    if cfg.rank < 1:
        raise DDBenchError(f"--rank must be positive, got {cfg.rank}")
    from ddbench.profile.cache import POLICIES
    from ddbench.profile.selection import parse_indexes
    parse_indexes(cfg.indexes)
    if any(not (x == 0 or x >= 1) for x in cfg.cache_capacities):
        raise DDBenchError("--cache-capacity values must be 0 (no cache) or at least 1")
    if cfg.cache_capacities and (not cfg.cache_policies or any(p not in POLICIES for p in cfg.cache_policies)):
        raise DDBenchError(f"--cache-policies: choose from {', '.join(POLICIES)}")
    plan = {}
    for c in cfg.contexts:
        if sliding_window and c + cfg.steps + 16 > sliding_window:
            raise DDBenchError(f"context {c} plus {cfg.steps} decode steps exceeds the model's sliding window of"
                               f" {sliding_window} tokens: its layers never see the whole context")
        need = c + cfg.steps + 16
        if need > max_positions and not cfg.allow_extrapolation:
            raise DDBenchError(f"context {c} plus {cfg.steps} decode steps exceeds the model's max_position_embeddings"
                               f" of {max_positions} (largest context: {max_positions - cfg.steps - 16});"
                               f" --allow-extrapolation to run anyway")
        ok = [b for b in cfg.budgets if b < c]
        if not ok:
            raise DDBenchError(f"budget {min(cfg.budgets)} is at or above the context of {c} tokens")
        for b in ok:
            Geometry(c, b, cfg.chunk, cfg.local).validate()
        plan[c] = ok
    return plan


def _is_oom(exc) -> bool:
    import torch
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    msg = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in msg or "can't allocate memory" in msg)


def largest_fit(loaded, context: int, steps: int, prefill_fn, grain: int = 256) -> int:
    """Largest multiple of `grain` below `context` whose prefill fits (halve, then bisect), else 0."""
    from transformers import DynamicCache

    def fits(c):
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        try:
            cache = DynamicCache(config=loaded.model.config)
            prefill_fn(loaded.model, [0] * (c + steps), cache)
            del cache
            return True
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                raise
            return False

    hi = context
    lo = (context // 2) // grain * grain
    while lo >= grain and not fits(lo):
        hi, lo = lo, (lo // 2) // grain * grain
    if lo < grain:
        return 0
    while hi - lo > grain:
        mid = (lo + hi) // 2 // grain * grain
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _mean(acc):
    return {k: (v / acc["n"] if k != "n" else v) for k, v in acc.items()}


def run(cfg: ProfileConfig, *, prefill_fn=None) -> dict:
    t_start = time.perf_counter()
    from ddbench.core.outputs import output_folder
    from ddbench.profile import trace

    _, gguf_file, _, name, mcfg = model_mod.inspect(cfg.model)
    sw = getattr(mcfg, "sliding_window", None) if getattr(mcfg, "use_sliding_window", True) else None
    if model_mod.global_layers(mcfg)[1] is not None and model_mod.global_layers(mcfg)[0]:
        sw = None      # Gemma 3: its global layers see the whole context; only they are measured
    budget_plan = validate(cfg, int(mcfg.max_position_embeddings), sw)
    from ddbench.profile.selection import check_indexes, parse_indexes
    indexes = parse_indexes(cfg.indexes)
    if any(n != "flat" for n in indexes):      # only a smaller index needs the head dim (int4's packing)
        check_indexes(indexes, getattr(mcfg, "head_dim", None) or mcfg.hidden_size // mcfg.num_attention_heads)
    out_dir = cfg.out
    if out_dir is None:
        from ddbench.core.paths import traces_dir
        out_dir = str(traces_dir("accuracy"))
    # accuracy/ is shared by every model's profile: this run replaces or prunes only this model's files
    with output_folder(out_dir, command="ddbench profile", shared=True, force=cfg.force,
                       scope=trace.names(name, True, True, True, True).values()) as w:
        w.claim(trace.names(name, bool(cfg.cache_capacities), cfg.fp8_error,
                            cfg.prompts is not None, cfg.run_lengths).values())    # refused now, not after the sweep
        result = _sweep(cfg, budget_plan, t_start, prefill_fn)
        result["files"] = trace.write(w, result.pop("name"), *result.pop("tables"), cache=result.get("cache"),
                                      fp8=result.get("fp8"), tasks=result.get("tasks"), runs=result.get("runs"))
    return result


def _sweep(cfg: ProfileConfig, budget_plan: dict, t_start: float, prefill_fn) -> dict:
    sweep = _Sweep(cfg, prefill_fn)
    for c in cfg.contexts:
        sweep.context(c, budget_plan[c])
    return sweep.result(t_start)


class _Sweep:
    """One profile sweep: the model loaded once, and the sums every prompt adds to.

    context(c, budgets)   every task and prompt at one context
    result(t_start)       the rows, the summary and the side tables, for trace.write
    """

    def __init__(self, cfg: ProfileConfig, prefill_fn):
        import torch

        from ddbench.profile import decode, fp8error, indexrates
        from ddbench.profile import runlengths as runs_mod
        from ddbench.profile.selection import parse_indexes

        self.cfg = cfg
        self.prefill_fn = prefill_fn or decode.prefill
        self.quiet = not cfg.progress
        torch.manual_seed(cfg.seed)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        self.ctx_time = {}
        from ddbench.core.provenance import short_sha
        self.git_sha = short_sha()     # the code that measures: read at the start (a long run outlives commits)
        self._load()
        self.groups = defaultdict(lambda: defaultdict(float))   # (layer, c, task, init, temp, budget) -> sums
        self.step_rows, self.task_acc = [], defaultdict(lambda: [0, 0])
        self.runs = [(i, t) for i in cfg.inits for t in cfg.temperatures]
        self.cache_groups = {}
        self.cache_runs = [r_ for r_ in self.runs if r_[0] == "t2" and r_[1] > 0] or self.runs   # the summary's basis
        self.fp8_errors = fp8error.Collector() if cfg.fp8_error else None
        self.run_lengths = runs_mod.Collector() if cfg.run_lengths else None
        self.n_prompts = cfg.samples if cfg.prompts is None else cfg.prompts
        self.methods = METHODS + (("fp8",) if cfg.fp8_error else ())
        self.indexes = parse_indexes(cfg.indexes)
        self.by_index = indexrates.Collector() if len(self.indexes) > 1 else None   # None: flat only, as before
        self.index_tasks = defaultdict(lambda: [0, 0])     # (index, c, task, budget) -> sparse [correct, total]

    def _load(self) -> None:
        from ddbench.progress import bar as progress_bar
        from ddbench.profile.hfattention import install
        with progress_bar(total=1, desc="load", quiet=self.quiet) as bar:
            t0 = time.perf_counter()
            self.loaded = model_mod.load(self.cfg.model, self.cfg.device)
            self.t_load = time.perf_counter() - t0
            bar.update(1)
        self.model, self.tok = self.loaded.model, self.loaded.tokenizer
        self.glob = self.loaded.global_layers or tuple(range(self.loaded.layers))
        self.probe = install(self.model)
        self.vocab = int(self.model.config.vocab_size)

    # ------------------------------------------------------------------ the measurements

    def context(self, c: int, budgets) -> None:
        cfg = self.cfg
        geo = Geometry(c, budgets[0], cfg.chunk, cfg.local)
        t_ctx = time.perf_counter()
        for task in cfg.tasks:
            for s in range(max(cfg.samples, self.n_prompts if cfg.quality else 0)):
                self._prompt(c, task, s, budgets, geo)
        self.ctx_time[c] = round(time.perf_counter() - t_ctx, 1)

    def _prompt(self, c: int, task: str, s: int, budgets, geo) -> None:
        """One prompt (with --questions, one shared haystack and its questions): its prefill, its measured runs
        (the first --samples prompts) and its task accuracy; running out of memory is one line naming the
        largest context that fits."""
        from ddbench.profile.kvcache import KVCache
        from ddbench.profile.tasks import make_prompts
        prompts = make_prompts(self.tok, task, c, self.cfg.seed + s, self.cfg.questions)
        cache = KVCache()      # full layers everywhere (a sliding-window layer cannot crop); keys written once
        try:
            self._passes(c, task, s, prompts, cache, budgets, geo)
        except DDBenchError:
            raise
        except Exception as exc:  # noqa: BLE001
            if not _is_oom(exc):
                raise
            del cache
            dev = self.loaded.device
            fit = largest_fit(self.loaded, c, self.cfg.steps, self.prefill_fn)
            raise DDBenchError(f"out of memory at context {c} on {dev}; the largest context that fits"
                               f" is {fit} tokens" if fit else
                               f"out of memory at context {c} on {dev}; not even 256 tokens fit") from None
        del cache

    def _passes(self, c: int, task: str, s: int, prompts, cache, budgets, geo) -> None:
        """The shared prefix prefilled once; then per question its own suffix, runs and task accuracy, the cache
        cut back to the prefix after each (one question: the whole prompt prefilled at once, as before)."""
        from ddbench.profile import decode, selection
        from ddbench.progress import bar as progress_bar
        cfg, Q = self.cfg, len(prompts)
        measure = s < cfg.samples       # hit rates (and fp8 error) on the first --samples prompts
        P = prompts[0].prefix if Q > 1 else c
        with progress_bar(total=P, desc=f"prefill {task} {c}", unit="tok", quiet=self.quiet) as bar:
            first = self.prefill_fn(self.model, prompts[0].ids[:P], cache, bar=bar)
        for j, prompt in enumerate(prompts):
            q = s * Q + j                    # the question's index: its sampling seed and its step rows' sample
            if Q > 1:
                first = decode.prefill(self.model, prompt.ids[P:], cache, start=P)
            lm = selection.landmarks(cache, geo)
            ixs = selection.build_indexes(lm, self.indexes)
            total = len(self.runs) * (cfg.steps + 1) if measure else 0
            with progress_bar(total=total, desc=f"steps {task} {c} q{j}", quiet=self.quiet) as bar:
                for init, temp in (self.runs if measure else ()):
                    seed = cfg.seed * 1_000_003 + q * 1009 + int(round(temp * 1000))
                    r = decode.dual_run(self.model, self.probe, cache, c, first, decode.DualSampling(
                        cfg.steps, init, temp, cfg.top_p, seed), vocab=self.vocab, bar=bar)
                    self._score_run(r, (lm, ixs), cache, (c, task, q, init, temp), budgets, geo)
            if cfg.quality and s < self.n_prompts:
                self._task_accuracy(cache, prompt, first, (lm, ixs), c, task, budgets, geo.selectable)
            decode.truncate(cache, P)

    def _score_run(self, r, lms, cache, run: tuple, budgets, geo) -> None:
        """One dual-token run scored at every budget under every index: the overlaps per layer and per step, the
        chunk-cache replay; the run lengths and the fp8 error (flat only)."""
        import torch
        cfg, (lm, ixs), (c, task, s, init, temp) = self.cfg, lms, run
        acc_t = torch.tensor(r.token_acc, dtype=torch.float32)
        sels = {}
        for name, ix in ixs.items():
            for b in budgets:
                sel = self._selections(r, lm, ix, b // cfg.chunk)   # [steps+1, G, 2, H, k]: G = the global layers
                if self.fp8_errors is not None and ix is None:
                    sels[b] = sel[:, :, 0]
                if self.run_lengths is not None and ix is None:
                    self.run_lengths.add(sel[1:, :, 0], c, task, b)      # the counted steps' true selections
                if cfg.cache_capacities and (init, temp) in self.cache_runs:
                    self._replay_cache(r, (lm, ix, name), sel, (c, task, b, s), geo)
                self._add_overlaps(r, acc_t, sel, (c, task, s, init, temp, b, name), geo)
        if self.fp8_errors is not None:
            _fp8_layers(self.fp8_errors, self.model, cache, r.q_out, sels, geo, c, task, self.glob)

    def _selections(self, r, lm, ix, k: int):
        """The output and speculative tokens' top-k chunks [steps+1, G, 2, H, k] of every global layer, under
        the index `ix` (per layer; None: flat, today's rule)."""
        import torch

        from ddbench.profile import selection
        return torch.stack([torch.stack([
            selection.select_by(torch.stack([r.q_out[t, l], r.q_spec[t, l]])[None], lm[l],
                                None if ix is None else ix[l], k)[0]
            for l in self.glob]) for t in range(self.cfg.steps + 1)])

    def _replay_cache(self, r, lmx, sel, where: tuple, geo) -> None:
        from ddbench.profile import cache as cache_mod
        cfg, (lm, ix, name), (c, task, b, s) = self.cfg, lmx, where
        counts = cache_mod.replay(sel[:, :, 0], sel[:-1, :, 1], geo.n_chunks, cfg.cache_capacities,
                                  cfg.cache_policies, scores=_pass_scores(r, lm, self.glob, ix, sel.shape[-1]),
                                  predictions=cache_mod.PREDICTIONS)
        for (how, pol, cap), cnt in counts.items():
            cache_mod.accumulate(self.cache_groups.setdefault(name, {}), (c, task, b, how, pol, cap), cnt, self.glob)
            if self.by_index is not None:
                self.by_index.add_cache((name, c, task, b, how, pol, cap), s, cnt, sel.shape[-1])

    def _add_overlaps(self, r, acc_t, sel, where: tuple, geo) -> None:
        """The run's overlaps at one budget into the per-layer sums and one row per step."""
        from ddbench.profile.metrics import overlaps
        c, task, s, init, temp, b, ix = where
        m = overlaps(sel[1:, :, 0], sel[:-1, :, 1], sel[:-1, :, 0], geo.n_chunks)
        for i, l in enumerate(self.glob):
            g = self.groups[(l, c, task, init, temp, b, ix)]
            for name, v in m.items():
                g[name] += float(v[:, i].sum())
            g["token_acc"] += float(acc_t.sum()) * self.loaded.kv_heads
            g["n"] += v[:, i].numel()
        if self.by_index is not None and (init, temp) in self.cache_runs:
            self.by_index.add_overlaps((ix, c, task, b), s, m)
        tag = {"index": ix} if self.by_index is not None else {}
        for t in range(self.cfg.steps):
            self.step_rows.append({"context_tokens": c, "task": task, "sample": s, "init": init,
                                   "temperature": temp, "budget_tokens": b, **tag, "step": t,
                                   **{n: float(v[t].mean()) for n, v in m.items()},
                                   "token_acc": int(r.token_acc[t]),
                                   "output_token": r.out_tokens[t + 1],
                                   "spec_token": r.spec_tokens[t]})

    def _task_accuracy(self, cache, prompt, first, lms, c, task, budgets, S: int) -> None:
        """The prompt's answer with dense attention, and at each budget with sparse exact top-k, low-rank keys
        and (with fp8_error) fp8 K/V; with --indexes, sparse top-k under each other index too."""
        from ddbench.profile import quality
        from ddbench.profile.hfattention import SparsePlan
        from ddbench.profile.lowrank import lowrank_keys
        cfg, model, probe, tok = self.cfg, self.model, self.probe, self.tok
        lm, ixs = lms
        ok, _ = quality.answer(model, probe, tok, cache, prompt, first, None)
        self.task_acc[(c, task, None, "dense")][0] += ok
        self.task_acc[(c, task, None, "dense")][1] += 1
        lk = lowrank_keys(model, cache, S, cfg.rank)
        kv8 = _fp8_kv(cache, S, cfg.chunk) if cfg.fp8_error else (None, None)
        for b in budgets:
            for method, keys, values in (("sparse", None, None), ("lowrank", lk, None),
                                         ("fp8", *kv8))[:len(self.methods) - 1]:
                plan = SparsePlan(landmarks=lm, budget_chunks=b // cfg.chunk, chunk=cfg.chunk,
                                  resident_from=S, keys=keys, values=values)
                ok, _ = quality.answer(model, probe, tok, cache, prompt, first, plan)
                self.task_acc[(c, task, b, method)][0] += ok
                self.task_acc[(c, task, b, method)][1] += 1
        for name, ix in ixs.items():
            for b in (budgets if ix is not None else ()):
                plan = SparsePlan(landmarks=lm, budget_chunks=b // cfg.chunk, chunk=cfg.chunk, resident_from=S,
                                  index=ix)
                ok, _ = quality.answer(model, probe, tok, cache, prompt, first, plan)
                self.index_tasks[(name, c, task, b)][0] += ok
                self.index_tasks[(name, c, task, b)][1] += 1

    # ------------------------------------------------------------------ the results

    def _rows(self) -> list[dict]:
        """One row per (layer, context, task, init, temperature, budget[, index]): the mean rates."""
        from ddbench.profile import trace
        cfg, rows, pos = self.cfg, [], {n: i for i, n in enumerate(self.indexes)}
        for (l, c, task, init, temp, b, ix), g in sorted(self.groups.items(),
                                                        key=lambda kv: (kv[0][1], kv[0][2], kv[0][3], kv[0][4],
                                                                        kv[0][5], pos[kv[0][6]], kv[0][0])):
            mm = _mean(g)
            tag = {"index": ix} if self.by_index is not None else {}
            rows.append({"layer": l, "context_tokens": c, "task": task, "init": init, "temperature": temp,
                         "top_p": cfg.top_p, "budget_tokens": b, **tag, "chunk_tokens": cfg.chunk,
                         "local_tokens": cfg.local, **{n: mm[n] for n in trace.RATES},
                         "token_acc": mm["token_acc"], "n": int(g["n"])})
        return rows

    def _provenance(self) -> dict:
        import torch
        import transformers

        from ddbench.core.provenance import utc_now
        return {"model": self.loaded.name, "layers": self.loaded.layers, "model_sha256": self.loaded.sha256,
                "transformers_version": transformers.__version__, "torch_version": torch.__version__,
                "git_sha": self.git_sha, "date": utc_now(offset=True),
                "command": self.cfg.command}

    def result(self, t_start: float) -> dict:
        from ddbench.profile import cache as cache_mod
        from ddbench.profile import trace
        cfg, loaded = self.cfg, self.loaded
        rows = self._rows()
        runtime = time.perf_counter() - t_start
        provenance = self._provenance()
        summary = summarize(cfg, loaded, [r for r in rows if r.get("index", "flat") == "flat"], self.task_acc,
                            provenance, runtime)
        if self.by_index is not None:
            summary["by_index"] = self.by_index.summary(self.indexes, summary["task_accuracy"], self.index_tasks)
        if self.fp8_errors is not None:
            summary["fp8_error"] = {"file": trace.names(loaded.name, fp8=True)["fp8_summary"]}
        summary["runtime_by_context_s"] = {str(c): v for c, v in self.ctx_time.items()}
        summary["load_s"] = round(self.t_load, 1)
        out = {"summary": summary, "rows": rows, "name": loaded.name,
               "tables": (rows, self.step_rows, summary, provenance)}
        if cfg.cache_capacities:
            crows = {n: cache_mod.rows(self.cache_groups.get(n, {}), cfg.chunk) for n in self.indexes}
            basis = ", ".join(f"init {i} temperature {t:g}" for i, t in self.cache_runs)
            csum = cache_mod.summary(crows["flat"], loaded.name, provenance, cfg.chunk, basis)
            out["cache"] = (crows["flat"] if self.by_index is None else
                            [{**r, "index": n} for n in self.indexes for r in crows[n]], csum)
        if self.fp8_errors is not None:
            out["fp8"] = (self.fp8_errors.rows(cfg.chunk), self.fp8_errors.summary(loaded.name, provenance, cfg.chunk))
        if cfg.prompts is not None:
            out["tasks"] = summary["task_accuracy"] if self.by_index is None else \
                [{**a, "index": "flat"} for a in summary["task_accuracy"]] + summary["by_index"]["task_rows"]
        if self.run_lengths is not None:
            out["runs"] = self.run_lengths.rows(cfg.chunk)
        return out


def _fp8_layers(collector, model, cache, q_out, sels, geo, context, task, glob) -> None:
    """The fp8 attention error of one run's output-token queries q_out [steps+1, L, Hq, d], every global
    layer: dense over the prompt, and over each budget's true selection sels[b] [steps+1, G, H, k]."""
    from ddbench.profile import fp8error
    P = geo.prompt_tokens
    for i, l in enumerate(glob):
        layer = cache.layers[l]
        att = model.model.layers[l].self_attn
        scaling = float(getattr(att, "scaling", None) or layer.keys.shape[-1] ** -0.5)
        kv = fp8error.variants(layer.keys[0, :, :P], layer.values[0, :, :P], geo.chunk, geo.selectable)
        q = q_out[:, l]
        kw = dict(chunk=geo.chunk, selectable=geo.selectable, scaling=scaling, kv=kv)
        collector.add(l, context, task, None, "dense", fp8error.layer_errors(q, None, None, **kw))
        for b, sel in sels.items():
            collector.add(l, context, task, b, "topk", fp8error.layer_errors(q, None, None, sel=sel[:, i], **kw))


def _fp8_kv(cache, S: int, chunk: int):
    """Per layer the selectable region's keys and values [1, H, S, d] through bf16 and fp8 (e4m3, one scale
    per chunk-head, kernels/fp8.py), dequantised: the "fp8" task-accuracy method's K/V."""
    import torch

    from ddbench.kernels.fp8 import dequantize_chunks, quantize_chunks

    def f(x):
        q, s = quantize_chunks(x[:, :, :S].to(torch.bfloat16), chunk)
        return dequantize_chunks(q, s, chunk)
    return [f(layer.keys) for layer in cache.layers], [f(layer.values) for layer in cache.layers]


def _pass_scores(r, lm, glob, ix=None, k: int = 0):
    """t -> pass t's landmark scores [G, H, 2, N] (output, speculative query) of the global layers, for the
    cache replay; under the index `ix` (per layer; None: flat) at a budget of k chunks, what it ranks."""
    import torch
    from ddbench.profile import selection

    def at(t):
        return torch.stack([selection.scores_by(torch.stack([r.q_out[t, l], r.q_spec[t, l]])[None], lm[l],
                                                None if ix is None else ix[l], k)[0]
                            .transpose(0, 1) for l in glob])
    return at


def _agg(rows, keys, cols=("hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share", "token_acc")):
    acc = defaultdict(lambda: defaultdict(float))
    for r in rows:
        g = acc[tuple(r[k] for k in keys)]
        for c in cols:
            g[c] += r[c] * r["n"]
        g["n"] += r["n"]
    out = []
    for key in sorted(acc):
        g = acc[key]
        out.append({**dict(zip(keys, key)), **{c: round(g[c] / g["n"], 6) for c in cols}, "n": int(g["n"])})
    return out


def summarize(cfg, loaded, rows, task_acc, provenance, runtime) -> dict:
    from ddbench.profile.trace import SCHEMA
    basis_rows = [r for r in rows if r["init"] == "t2" and r["temperature"] > 0]
    basis = "init t2, temperature > 0 (sampled output), all contexts, tasks and budgets"
    if not basis_rows:
        basis_rows, basis = rows, "all rows (no sampled t2 run in this sweep)"
    per_layer = _agg(basis_rows, ("layer",), ("hit_rate", "reuse_hit_rate", "union_hit_rate", "new_pred_share"))
    low = [r["layer"] for r in per_layer if r["hit_rate"] < cfg.lowrank_threshold]
    cfg_d = {k: v for k, v in asdict(cfg).items() if k not in ("progress", "command", "out", "force")}
    if tuple(cfg_d["indexes"]) == ("flat",):
        del cfg_d["indexes"]           # flat only: the summary as before --indexes existed
    cfg_d["model"] = os.path.basename(str(cfg_d["model"]).rstrip(os.sep))
    return {
        "schema": SCHEMA, "model": loaded.name, "provenance": provenance,
        "shape": {"model_type": loaded.model_type, "layers": loaded.layers, "q_heads": loaded.q_heads,
                  "kv_heads": loaded.kv_heads, "head_dim": loaded.head_dim, "max_positions": loaded.max_positions,
                  "device": loaded.device, "dtype": loaded.dtype},
        "config": cfg_d, "runtime_s": round(runtime, 1),
        "selection": {"rule": "ddbench.kernels.select.select_chunks_ref over ddbench.kernels.landmarks.build_landmarks_ref",
                      "local_tokens": cfg.local, "sink_tokens": 0,
                      "scored": "selectable chunks only; the local window and generated tokens are always resident"},
        "per_layer": {"basis": basis, "rows": per_layer},
        "by_init_temperature": _agg(rows, ("init", "temperature")),
        "by_context_budget": _agg([r for r in rows if r["temperature"] > 0], ("context_tokens", "budget_tokens", "init"),
                                  ("hit_rate", "reuse_hit_rate", "token_acc")),
        "lowrank_layers": {"rule": "§5.3: layers whose mean hit rate is below the threshold",
                           "threshold": cfg.lowrank_threshold, "basis": basis, "layers": low},
        "task_accuracy": [{"context_tokens": c, "task": t, "budget_tokens": b, "method": m,
                           **({"rank": cfg.rank} if m == "lowrank" else {}),
                           "correct": v[0], "total": v[1], "accuracy": round(v[0] / v[1], 4),
                           **dict(zip(("low", "high"), (round(x, 4) for x in wilson(v[0], v[1]))))}
                          for (c, t, b, m), v in sorted(task_acc.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                          kv[0][2] or 0,
                                                                                          ALL_METHODS.index(kv[0][3])))],
    }
