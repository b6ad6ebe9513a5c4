"""The cost model: how long each piece of a decode step takes, on a GPU and a link.

Sources, in order of preference, and every output says which one was used (`CostModel.notes`):
1. a calibration bundle measured on this GPU (traces/calibration/<gpu>/);
2. a bundle measured on another GPU, scaled op by op by the catalog's HBM and FLOP ratios:
   t_target = t_measured * roofline_target(op) / roofline_source(op), where
   roofline(op) = max(FLOPs / datasheet bf16 rate, bytes / datasheet HBM bandwidth);
3. no bundle at all: a pure roofline from the catalog (datasheet FLOP/s and HBM, link achievable rate).

The decode step's GPU compute (every op of sim/steplayers.py) is RECONCILED with the decode-step
engine where the bundle has fitted parameters (sim/fitted.py: traces/fit/<gpu>/fitted.json, written
once by `python -m ddbench.sim.fit` from the engine's kernel breakdown and the bundle's engine section): each
category is a model linear in a few physical terms (a fixed cost per layer, a time per byte read), and
every sparse design is then costed with the engine's kernels. ShadowKV's fetch and dualdecoder-cache's
fill come from the same file. Without it (or where it was fitted to other inputs than this bundle's),
decode ops come from the bundle's microbenchmarks (linear.csv, kernels.csv), and the notes say NOT
RECONCILED and why. Prefill is always priced from the microbenchmarks. Nothing here fits.

Link rates (sim/linkcosts.py, the mixin CostModel inherits) come from the bundle's link table for the
bundle's own link (PCIe 5 on the H200); for another link they are scaled by the catalog's achievable
rate over the bundle's big-copy rate.
Time is in seconds throughout. No torch here.
"""

from __future__ import annotations

import math

import numpy as np

from ddbench.core.calibration import Bundle
from ddbench.core.catalog.gpus import GPUSpec, get_gpu
from ddbench.core.catalog.links import LinkSpec
from ddbench.core.catalog.models import ModelSpec
from ddbench.sim.fitted import COMMAND, ENGINE_TERMS, CacheFill, EngineFit, Fitted, ReuseFetchFit, for_bundle  # noqa: F401
from ddbench.sim.linkcosts import LinkCosts, LinkRates, fit_affine, interp_clamped  # noqa: F401  (LinkRates: re-exported)

E = 2  # bf16 bytes
SCORE_BYTES = 2   # the engine's selection stores its pass-1 scores in fp16 (kernels/engine/fastselect.py)
# the engine's ShadowKV reuse gather (kernels/gather.py gather_uva defaults, kernels/engine/engine.py reuse_launch)
ENGINE_REUSE_PROGRAMS, ENGINE_REUSE_IN_FLIGHT = 32, 2
class CostModel(LinkCosts):
    """The cost model of one (model, GPU, link, bundle): compute here, the link in sim/linkcosts.py."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, link: LinkSpec, bundle: Bundle | None = None,
                 reconcile: bool = True, fitted: Fitted | None = None):
        """fitted: the fitted parameters to price with (sim/fitted.py); None: the bundle's own, found by
        ddbench.sim.fitted.for_bundle (none without a bundle). reconcile: price the decode compute with the
        fitted engine terms where there are some (False: the microbenchmark op model; ShadowKV's fetch
        and the cache fill still come from `fitted`)."""
        self.model, self.gpu, self.link, self.bundle = model, gpu, link, bundle
        self.notes: list[str] = []
        self._cache: dict = {}
        self.quant_scan_groups: list[int] = []   # quant groups of the bundle's triton_quant_scan rows
        self.engine: EngineFit | None = None     # the reconciled decode compute (fitted.engine), or None
        self._theta: dict | None = None          # its parameters (set_engine_terms)
        self._raw = False                        # price the engine terms unscaled (the fit's features)
        self.cache_fill: CacheFill | None = None     # dualdecoder-cache's fill, or None
        self.reuse_fits: dict = {}                   # (chunk_bytes, programs, in_flight) -> ReuseFetchFit
        self.tp, self.comm = 1, None                 # tensor parallelism: ranks and their interconnect
        if fitted is None:
            fitted = for_bundle(bundle) if bundle is not None else Fitted(why="no calibration bundle")
        self.fitted = fitted
        if bundle is None:
            self.source_gpu = gpu
            self.peak_flops = gpu.bf16_tflops * 1e12
            self.hbm = (gpu.measured_hbm_gbps or gpu.hbm_gbps) * 1e9
            self.notes.append(f"ROOFLINE: no calibration bundle; compute = max(FLOPs / {gpu.bf16_tflops} TFLOP/s,"
                              f" bytes / {self.hbm / 1e9:.0f} GB/s) from the catalog; link at the catalog's"
                              f" achievable {link.achievable_gbps} GB/s")
            self.scaled = False
        else:
            self.source_gpu = get_gpu(bundle.gpu)
            ceil = {r["name"]: r["value"] for r in bundle.rows["ceilings"]}
            self.peak_flops = ceil.get("bf16_gemm_tflops", self.source_gpu.bf16_tflops) * 1e12
            self.hbm = ceil.get("hbm_d2d_copy_gbps", self.source_gpu.hbm_gbps) * 1e9
            self.scaled = self.source_gpu.name != gpu.name
            self.notes.append(f"measured: {bundle.describe()}")
            if self.scaled:
                self.notes.append(
                    f"SCALED: no bundle for {gpu.name}; times of the {self.source_gpu.name} bundle scaled per op by"
                    f" the catalog's roofline ratio (HBM {gpu.hbm_gbps:.0f} vs {self.source_gpu.hbm_gbps:.0f} GB/s,"
                    f" bf16 {gpu.bf16_tflops:.0f} vs {self.source_gpu.bf16_tflops:.0f} TFLOP/s)")
            self._build_tables(bundle)
            self.reuse_fits = dict(fitted.reuse)
            self.cache_fill = fitted.cache_fill
            fit = fitted.engine if reconcile else None
            if fit is not None:
                self.set_engine_terms(fit.theta)
                self.engine = fit
                self.notes.append(fit.describe() + f"; fitted once by `{COMMAND}` into {fitted.shown}")
            else:
                why = ("not asked" if not reconcile else
                       "the bundle has no engine kernel breakdown (breakdown.json)" if not bundle.breakdown else
                       f"no fitted engine terms for this bundle: {fitted.why}; `{COMMAND}` fits them")
                self.notes.append(f"NOT RECONCILED with the engine ({why}): decode compute from the bundle's"
                                  " microbenchmarks (linear layers timed as eager calls, kernels as graph replays),"
                                  " which were not validated against the engine")

    def set_engine_terms(self, theta: dict | None, raw: bool = False) -> None:
        """Price the decode compute with these engine terms (category -> parameters, ENGINE_TERMS order),
        or with the microbenchmarks (None). raw: unscaled whatever the GPU (sim/fit/engine.py prices
        with unit terms to read each term's feature off a step)."""
        self._theta = None if theta is None else {k: np.array(v, dtype=float) for k, v in theta.items()}
        self._raw = raw

    def set_tensor_parallel(self, tp: int, comm) -> None:
        """Price one rank of a TP group of `tp`: `self.model` is its shard (ddbench.core.tp.rank_model) and
        `comm` (ddbench.core.catalog.interconnect.Interconnect) prices its all-reduces."""
        self.tp, self.comm = tp, comm
        if tp > 1:
            self.notes.append(f"TP {tp}: two all-reduces of the hidden state per layer, {comm.describe()}")

    def allreduce_s(self, nbytes: float) -> float:
        """One all-reduce of `nbytes` over the TP group; 0 without tensor parallelism."""
        if self.tp <= 1:
            return 0.0
        return self.comm.allreduce_s(nbytes, self.tp, self.link.achievable_gbps)

    # ------------------------------------------------------------------ the engine fit
    def _eng(self, category: str, x, flops: float, nbytes: float) -> float:
        """An op priced by the engine fit: its parameters . its features x, scaled to another GPU."""
        t = float(np.dot(self._theta[category], x))
        return t if self._raw else self._scale(t, flops, nbytes)

    # ------------------------------------------------------------------ tables
    def _build_tables(self, b: Bundle) -> None:
        self.linear_tab: dict[tuple[int, int], tuple[list, list]] = {}
        by_shape: dict[tuple[int, int], dict[int, float]] = {}
        for r in b.rows["linear"]:
            by_shape.setdefault((int(r["k"]), int(r["n"])), {})[int(r["m_tokens"])] = r["latency_ms"] / 1e3
        for shape, pts in by_shape.items():
            ms = sorted(pts)
            self.linear_tab[shape] = (ms, [pts[m] for m in ms])
        self.kernel_fits: dict = {}
        groups: dict = {}
        # the quant groups SpeCache's measured selection (triton_quant_scan) was timed at (2-bit codes)
        self.quant_scan_groups = sorted({int(r["param"]) for r in b.rows["kernels"]
                                         if r["kernel"] == "triton_quant_scan"})
        for r in b.rows["kernels"]:
            cfg = (int(r["num_heads"]), int(r["num_kv_heads"]), int(r["head_dim"]))
            key = (r["kernel"], int(r["q_tokens"]) if r["kernel"] != "sdpa_prefill" else 0)
            x = self._kernel_x(r["kernel"], int(r["batch"]), int(r["q_tokens"]), int(r["kv_tokens"]), *cfg,
                               int(r["param"]))
            groups.setdefault(key + (cfg,), []).append((x, r["latency_ms"] / 1e3))
            groups.setdefault(key + (None,), []).append((x, r["latency_ms"] / 1e3))
        # the decode-step engine's measured compute-only step (bundle section `engine`)
        self.set_engine_rows(b.rows.get("engine", []))
        for key, pts in groups.items():
            if key[0] == "sdpa_prefill":
                rates = sorted(x / y for x, y in pts)
                self.kernel_fits[key] = (0.0, 1.0 / rates[len(rates) // 2])  # seconds per FLOP
            else:
                self.kernel_fits[key] = fit_affine(pts)

    @staticmethod
    def _kernel_x(kernel, batch, q, kv, hq, hk, d, param) -> float:
        """The variable a kernel's time is fitted against: bytes read (decode kernels) or FLOPs (prefill)."""
        if kernel in ("sdpa_decode", "triton_attention"):
            return 2 * batch * hk * kv * d * E
        if kernel in ("select_landmarks", "triton_select"):
            return batch * hk * (kv // max(param, 1)) * d * E
        if kernel == "lowrank_rebuild":
            return (batch * kv * param + param * hk * d + batch * kv * hk * d) * E
        if kernel == "triton_rebuild":  # U's rows are read once per KV head; SV is per request
            return (batch * hk * kv * param + batch * hk * param * d + batch * hk * kv * d) * E
        if kernel == "triton_quant_scan":  # SpeCache's 2-bit codes + bf16 scale and zero per group of param tokens
            return batch * hk * kv * (d * 2 / 8 + 2 * E * d / max(param, 1))
        if kernel == "sdpa_prefill":
            return 4.0 * batch * q * kv * hq * d
        raise KeyError(kernel)

    # ------------------------------------------------------------------ scaling
    def _roof(self, flops: float, nbytes: float, spec: GPUSpec) -> float:
        return max(flops / (spec.bf16_tflops * 1e12), nbytes / (spec.hbm_gbps * 1e9))

    def _scale(self, t: float, flops: float, nbytes: float) -> float:
        if not self.scaled:
            return t
        den = self._roof(flops, nbytes, self.source_gpu)
        return t * self._roof(flops, nbytes, self.gpu) / den if den else t   # a fixed cost: as measured

    def _roofline(self, flops: float, nbytes: float) -> float:
        return max(flops / self.peak_flops, nbytes / self.hbm)

    def set_engine_rows(self, rows: list[dict]) -> None:
        """(Re)build the engine tables from engine-section rows (the bundle's, or an engine sweep's
        read by ddbench.core.calibration.engine_section_rows): layer 'step' = the compute-only step
        with the model's own selection; layer 'step-forced-miss' = the same step with the sweep
        harness's forced-miss draw (kernels/engine/bench.py), kept apart (engine_harness_s)."""
        self.engine_tab: dict[tuple[str, int], tuple[list, list]] = {}
        self.engine_forced_tab: dict[tuple[str, int], tuple[list, list]] = {}
        for layer, tab in (("step", self.engine_tab), ("step-forced-miss", self.engine_forced_tab)):
            eng: dict = {}
            for r in rows:
                if r.get("layer") == layer and r.get("model") == self.model.name:
                    eng.setdefault((r["system"], int(r["context"])), {})[int(r["batch"])] = r["compute_ms"] / 1e3
            for key, pts in eng.items():
                bs = sorted(pts)
                tab[key] = (bs, [pts[x] for x in bs])

    def engine_harness_s(self, system: str, batch: int, context: int, clamp: bool = False) -> float | None:
        """The sweep harness's per-step cost of forcing misses (the forced-miss draw; not a design cost):
        the compute-only step with forced misses minus the one with the model's own selection, both
        from the calibration sweep's floor phase, piecewise linear in the batch; None where either is
        not measured at this context and batch (clamp: at the nearest measured batch outside them)."""
        a = self.engine_step_s(system, batch, context, forced=True, clamp=clamp)
        b = self.engine_step_s(system, batch, context, clamp=clamp)
        if a is None or b is None:
            return None
        if clamp:      # both at the same batch: the nearest one both tables measured
            tf, to = self.engine_forced_tab[(system, int(context))], self.engine_tab[(system, int(context))]
            common = sorted(set(tf[0]) & set(to[0]))
            if common and not common[0] <= batch <= common[-1]:
                x = common[0] if batch < common[0] else common[-1]
                return self.engine_step_s(system, x, context, forced=True) - self.engine_step_s(system, x, context)
        return a - b

    def engine_step_s(self, system: str, batch: int, context: int, forced: bool = False,
                      clamp: bool = False) -> float | None:
        """The engine's measured compute-only step (seconds) of `system` at `context`, piecewise linear
        in the batch between the measured batches (None outside them, or at the nearest one with clamp,
        or without rows). forced: the step with the harness's forced-miss draw (layer 'step-forced-miss').
        Data, not a cost: the cost model prices compute with its fitted terms (EngineFit)."""
        tabs = getattr(self, "engine_forced_tab" if forced else "engine_tab", {})
        tab = tabs.get((system, int(context)))
        if tab is None:
            return None
        bs, ts = tab
        if not bs[0] <= batch <= bs[-1] and not clamp:
            return None
        return interp_clamped([float(x) for x in bs], ts, float(batch))

    # ------------------------------------------------------------------ ops (seconds)
    def decode_linear_s(self, k: int, n: int, m: int) -> float:
        """A decode step's k x n linear layer at m rows (tokens): the engine fit's GEMM where reconciled,
        else linear_s (the bundle's eager microbenchmark)."""
        if self._theta is None:
            return self.linear_s(k, n, m)
        return self._eng("gemm", (k * n * E, m * k * n * E), 2.0 * m * k * n, (k * n + m * k + m * n) * E)

    def glue_s(self, rows: int) -> float:
        """The small kernels of one layer around its GEMMs (norms, RoPE, SwiGLU, residual adds) at `rows`
        tokens; 0 where not reconciled (the microbenchmarks have none: not modelled)."""
        if self._theta is None:
            return 0.0
        nbytes = rows * self.model.hidden * E
        return self._eng("glue", (1.0, nbytes, 0.0), 0.0, nbytes)

    def assemble_s(self, batch: int, resident_rows: int) -> float:
        """Assembling one layer's attended buffer: the engine copies the resident window (outliers,
        local chunks, generated-token slots: `resident_rows` tokens of K and V) into it and writes the
        new token's K/V; 0 where not reconciled."""
        if self._theta is None:
            return 0.0
        m = self.model
        nbytes = 2 * 2 * batch * m.num_kv_heads * resident_rows * m.head_dim * E   # K and V, read + written
        return self._eng("glue", (0.0, 0.0, nbytes), 0.0, nbytes)

    def cache_fill_s(self, batch: int, slots: int) -> float:
        """One chunk-cache fill of one layer (lookup, LRU eviction, miss plan: sim/fitted.py CacheFill),
        FITTED to the engine where the fitted parameters have it; else 0, and the notes say NOT MEASURED."""
        if self.cache_fill is None:
            self._note(f"cache fill NOT MEASURED (no fitted cache fill for this bundle: {self.fitted.why or self.fitted.shown + ' has none'}):"
                       " dualdecoder-cache's lookup and eviction are priced at 0")
            return 0.0
        if self.cache_fill.sources:
            self._note(self.cache_fill.describe() + ("; measured on the bundle's GPU, not scaled" if self.scaled else ""))
        return self.cache_fill.fill_s(batch, slots)

    def linear_s(self, k: int, n: int, m: int) -> float:
        key = ("lin", k, n, m)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        flops, nbytes = 2.0 * m * k * n, (k * n + m * k + m * n) * E
        tab = self.linear_tab.get((k, n)) if self.bundle else None
        if tab is None:
            t = self._roofline(flops, nbytes)
            if self.bundle:
                self._note(f"ROOFLINE: linear {k}x{n} not in the bundle; roofline at the bundle's measured ceilings")
        else:
            ms, ts = tab
            t = ts[-1] * m / ms[-1] if m > ms[-1] else interp_clamped(ms, ts, m)
            t = self._scale(t, flops, nbytes)
        self._cache[key] = t
        return t

    def _has(self, kernel: str) -> bool:
        return any(k[0] == kernel for k in getattr(self, "kernel_fits", {}))

    def _pick(self, triton: str, torch_name: str, use_triton: bool) -> str:
        """The Triton kernel where the design runs it and the bundle has it, else the torch one."""
        if not use_triton:
            return torch_name
        if self.bundle is not None and self._has(triton):
            return triton
        if self.bundle is not None:
            self._note(f"{triton} has no rows in the bundle: costed with {torch_name} instead")
        return torch_name

    def _kernel(self, kernel: str, q: int, x: float, flops: float, nbytes: float) -> float:
        m = self.model
        cfg = (m.num_heads, m.num_kv_heads, m.head_dim)
        fit = None
        if self.bundle:
            fit = self.kernel_fits.get((kernel, q, cfg)) or self.kernel_fits.get((kernel, q, None))
            if fit is not None and (kernel, q, cfg) not in self.kernel_fits:
                self._note(f"{kernel} (q={q}) fitted on other head configurations of the bundle")
        if fit is None:
            if self.bundle:
                self._note(f"ROOFLINE: {kernel} q={q} has no rows in the bundle")
            return self._roofline(flops, nbytes)
        a, b = fit
        return self._scale(a + b * x, flops, nbytes)

    def attention_decode_s(self, batch: int, q: int, kv_tokens: int, triton: bool = False) -> float:
        """Decode attention of `q` new tokens per request over kv_tokens cached tokens (one layer, whole batch).

        triton: the sparse path's Triton kernel (kernels/attention.py; q = 2 is the dual-token
        kernel, which reads each K/V tile once for both tokens), else torch SDPA."""
        m = self.model
        nbytes = 2 * batch * m.num_kv_heads * kv_tokens * m.head_dim * E
        flops = 4.0 * batch * q * kv_tokens * m.num_heads * m.head_dim
        if self._theta is not None:      # the engine's attention kernel (whatever `triton` says)
            return self._eng("attention", (1.0, nbytes), flops, nbytes)
        x = nbytes
        return self._kernel(self._pick("triton_attention", "sdpa_decode", triton), q, x, flops, nbytes)

    def select_s(self, batch: int, q: int, context: int, chunk: int, triton: bool = False) -> float:
        """Score q query rows per request against ceil(S/C) landmarks, group max, top-k (one layer)."""
        m = self.model
        n = math.ceil(context / chunk)
        nbytes = batch * m.num_kv_heads * n * m.head_dim * E
        flops = 2.0 * batch * q * m.num_heads * n * m.head_dim
        if self._theta is not None:      # the engine's selection: pass 1 (fp16 scores), then its top-k
            lm = nbytes + batch * m.num_heads * q * n * SCORE_BYTES
            return self._eng("selection", (1.0, q, lm, 0.0, batch * q * m.num_kv_heads * n, n), flops, lm)
        return self._kernel(self._pick("triton_select", "select_landmarks", triton), q, nbytes, flops, nbytes)

    def rebuild_s(self, batch: int, tokens: int, rank: int, triton: bool = False) -> float:
        """Low-rank key rebuild U[rows] @ SV for `tokens` selected rows per request (one layer)."""
        m = self.model
        if self._theta is not None:      # the engine's rebuild kernel (whatever `triton` says)
            hk, d = m.num_kv_heads, m.head_dim
            nbytes = (batch * tokens * rank + batch * hk * rank * d + batch * hk * tokens * d) * E
            return self._eng("rebuild", (1.0, nbytes), 2.0 * batch * tokens * rank * hk * d, nbytes)
        kernel = self._pick("triton_rebuild", "lowrank_rebuild", triton)
        hk, d = m.num_kv_heads, m.head_dim
        if kernel == "triton_rebuild":
            x = (batch * hk * tokens * rank + batch * hk * rank * d + batch * hk * tokens * d) * E
        else:
            x = (batch * tokens * rank + rank * hk * d + batch * tokens * hk * d) * E
        nbytes = (batch * tokens * rank + rank * hk * d + batch * tokens * hk * d) * E
        flops = 2.0 * batch * tokens * rank * hk * d
        return self._kernel(kernel, 1, x, flops, nbytes)

    def quant_scan_s(self, batch: int, q: int, context: int, bits: int, group: int, chunk: int = 8) -> float:
        """SpeCache's selection of one layer: score q query rows per request against a resident `bits`-bit
        key copy (scale and zero per `group` tokens), chunk max, top-k.

        Reconciled (the bundle has an engine breakdown): the engine fit's selection at the engine's
        (2 bits, group 64): pass 1 over the codes, scales and zeros, then the same top-k terms as the
        landmark selection. Otherwise, measured (the bundle has `triton_quant_scan` rows): the decode-step
        engine's selection (ddbench.kernels.engine.fastselect.specache_select_topk: pass 1 over the 2-bit codes and
        the fused top-k, so the top-k is included here and costed nowhere else), fitted like the other kernels against
        the bytes read (codes + scales + zeros) and scaled per op on another GPU. Only at the measured
        2 bits and group; any other (bits, group), or a bundle without the rows (older bundles) or no
        bundle: the HBM roofline of the read (no top-k), with a ROOFLINE note saying why."""
        m = self.model
        nbytes = batch * m.num_kv_heads * context * (m.head_dim * bits / 8 + 2 * E * m.head_dim / group)
        flops = 2.0 * batch * q * m.num_heads * context * m.head_dim
        if self._theta is not None and (bits, group) == tuple(self.engine.quant if self.engine else (bits, group)):
            # the engine's SpeCache selection: pass 1 over the codes, then the same top-k as the landmarks'
            cand = batch * q * m.num_kv_heads * math.ceil(context / chunk)
            return self._eng("selection", (1.0, q, 0.0, nbytes, cand, math.ceil(context / chunk)), flops, nbytes)
        groups = self.quant_scan_groups
        if groups and bits == 2 and group in groups:
            return self._kernel("triton_quant_scan", q, nbytes, flops, nbytes)
        if groups:
            self._note(f"ROOFLINE: SpeCache's quantized-key scoring at {bits} bits, group {group} is costed at the HBM"
                       f" roofline: the bundle's triton_quant_scan rows measure 2 bits, group"
                       f" {'/'.join(map(str, groups))} only")
        else:
            self._note("ROOFLINE: SpeCache's quantized-key scoring is costed at the HBM roofline (no kernel measured)")
        return self._roofline(flops, nbytes)

    def prefill_attention_s(self, q_tokens: int, prefix: int) -> float:
        """Causal attention of a prefill chunk of q tokens after `prefix` cached tokens (one layer)."""
        m = self.model
        flops = 4.0 * q_tokens * (prefix + q_tokens / 2) * m.num_heads * m.head_dim
        nbytes = 2 * (prefix + q_tokens) * m.num_kv_heads * m.head_dim * E
        return self._kernel("sdpa_prefill", 0, flops, flops, nbytes)

    def svd_s(self, tokens: int, rank: int) -> float:
        """Prefill SVD of the pre-RoPE keys [S, H_kv*d] to rank r (randomized: about 6 S n r FLOPs; roofline)."""
        n = self.model.num_kv_heads * self.model.head_dim
        self._note("ROOFLINE: the prefill SVD of the low-rank designs is costed at the FLOP roofline")
        return self._roofline(6.0 * tokens * n * rank, tokens * n * E * 3)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
