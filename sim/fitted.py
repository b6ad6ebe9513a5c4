"""The fitted parameters the cost model prices with: typed, loaded, never fitted here.

`python -m ddbench.sim.fit` (sim/fit/) fits them ONCE from committed measurements and writes one file per
calibration bundle, `<data root>/fit/<gpu>/fitted.json` (traces/fit/h200/fitted.json), with the
sha256 of every input it read, the git sha and command, and the residuals:

  engine       the decode compute reconciled with the engine (EngineFit): ENGINE_TERMS per category,
               fitted to the engine's kernel breakdown and the bundle's engine section
  reuse_fetch  ShadowKV's fetch as the engine runs it (ReuseFetchFit), per gather shape, fitted to the
               bundle's reuse_fetch records
  cache_fill   dualdecoder-cache's fill (CacheFill), fitted to the engine's chunk-cache sweep at one
               context (null where no such sweep was measured)

`for_bundle(bundle)` finds the file for a bundle (beside the bundle's own data root, then the data
root's) and takes it only where the bundle's files are the ones it was fitted to (sha256): a bundle
that was measured again, or another one, gets no fitted terms, and the cost model's notes say why
and what to run. The engine terms also need the bundle's breakdown to be the fitted one. No torch,
no SimPy; nothing here fits or validates.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ddbench.core.designs import DUALDECODER_CACHE
from ddbench.core.errors import DDBenchError

FILE = "fitted.json"
FOLDER = "fit"                # <data root>/fit/<gpu>/fitted.json
SCHEMA = 2
COMMAND = "python -m ddbench.sim.fit"

# The decode-step engine's kernels by category (kernels/engine/breakdown.py), each priced as a dot product of
# a parameter vector with the op's feature vector (per layer, or the LM head); the parameters' names and units:
ENGINE_TERMS = {
    "gemm": ("s_per_weight_byte", "s_per_weight_byte_per_row"),
    "selection": ("fixed_s", "per_query_token_s", "s_per_landmark_byte", "s_per_code_byte", "s_per_candidate",
                  "s_per_row_chunk"),
    "attention": ("fixed_s", "s_per_kv_byte"),
    "rebuild": ("fixed_s", "s_per_byte"),
    "glue": ("fixed_s", "s_per_activation_byte", "s_per_resident_byte"),
}
CACHE_FILL_DESIGN = DUALDECODER_CACHE
CACHE_FILL_TERMS = ("fixed_s", "per_slot_s", "per_request_s", "per_request_slot_s")


# --------------------------------------------------------------------------- the three fits, typed

@dataclass(frozen=True)
class EngineFit:
    """The decode step's compute as the engine's kernels take it, per category (ENGINE_TERMS), fitted to
    the engine's kernel breakdown (compute-only CUDA-graph steps of Llama-3-8B, kernels/engine/breakdown.py):

      gemm       t = W x (a + b x M)                  W weight bytes of the GEMM, M its rows (tokens)
      selection  t = f + g q + landmark bytes x c_l + code bytes x c_q + candidates x c_t + N x c_n
                 (landmarks: pass 1 reads b Hk N d and writes fp16 scores b Hq q N; SpeCache: the 2-bit codes
                 with their scales and zeros; top-k over b q Hk N chunk candidates, and a row's walk over its
                 N chunks, which bounds it at small batch; q query tokens per request, N = S / chunk)
      attention  t = f + K/V bytes attended x c
      rebuild    t = f + (U rows + SV + rebuilt K) bytes x c      (ShadowKV's low-rank keys)
      glue       t = f + rows x hidden bytes x c_a + resident rows copied x c_r
                 (norms, RoPE, SwiGLU, residual adds; assembling the attended buffer from the resident window)

    per layer (the LM head: one GEMM). The parameters by least squares on the measured times, relative
    (each weighted by 1 / itself), none negative: the breakdown's categories and, `joint`, the bundle's
    engine section's whole steps (sim/fit/engine.py). `quant`: the (bits, group) SpeCache's scan was
    measured at. The points run the engine's Workload (the core defaults)."""
    theta: dict               # category -> tuple of parameters (ENGINE_TERMS order)
    residuals: tuple          # (point label, category, fitted / measured - 1)
    step_residuals: tuple     # (point label, fitted step / measured step - 1): the breakdown's steps
    floor_residuals: tuple    # the same against the bundle's engine section (whole compute-only steps)
    points: int
    quant: tuple
    source: str = ""
    joint: bool = False       # the engine section's steps were fitted too (else only checked)

    @property
    def parameters(self) -> int:
        return sum(len(v) for v in self.theta.values())

    def max_residual(self, which: str = "residuals") -> tuple:
        rs = getattr(self, which)
        return max(rs, key=lambda r: abs(r[-1])) if rs else ("", 0.0)

    def describe(self) -> str:
        t = self.theta
        g, sl, a, r, gl = t["gemm"], t["selection"], t["attention"], t["rebuild"], t["glue"]

        def rate(x):
            return f"{1 / x / 1e9:.0f} GB/s" if x > 0 else "free"
        cat = self.max_residual()
        step = self.max_residual("step_residuals")
        both = f" and the {len(self.floor_residuals)} whole steps of the bundle's engine section" if self.joint else ""
        out = (f"decode compute RECONCILED with the engine: {self.parameters} terms fitted to the kernel times by"
               f" category of {self.points} compute-only CUDA-graph engine steps"
               f"{' (' + self.source + ')' if self.source else ''}{both}:"
               f" GEMM weights at {rate(g[0])}, {g[1] / g[0] if g[0] else 0:.2%} more per row; selection"
               f" {sl[0] * 1e6:.1f} us + {sl[1] * 1e6:.1f} us per query token + landmarks at {rate(sl[2])}, 2-bit codes"
               f" at {rate(sl[3])}, {sl[4] * 1e12:.1f} ps per top-k candidate, {sl[5] * 1e9:.2f} ns per chunk of a row;"
               f" attention {a[0] * 1e6:.1f} us + K/V at"
               f" {rate(a[1])}; key rebuild {r[0] * 1e6:.1f} us + {rate(r[1])}; glue {gl[0] * 1e6:.1f} us +"
               f" activations at {rate(gl[1])} + resident rows at {rate(gl[2])} (per layer); max |residual| by"
               f" category {abs(cat[-1]):.1%} ({cat[0]} {cat[1]}), whole steps {abs(step[-1]):.1%} ({step[0]})")
        if self.floor_residuals:
            fl = self.max_residual("floor_residuals")
            med = sorted(abs(x[-1]) for x in self.floor_residuals)[len(self.floor_residuals) // 2]
            out += (f"; {'' if self.joint else 'unfitted check: '}the engine section's steps: median |residual|"
                    f" {med:.1%}, max {abs(fl[-1]):.1%} ({fl[0]})")
        return out + "; every sparse design costed with the engine's kernels, whatever its `kernels` switch"


@dataclass(frozen=True)
class ReuseFetchFit:
    """The engine's ShadowKV fetch of one layer as it ran before its in-place ShadowKV step (the copy-then-regather
    step, kernels/engine/engine.py reuse_fetch of that code; the in-place step replaced it: these
    parameters describe the old engine and price only its rows in the validation), fitted to the
    bundle's `reuse_fetch` records of one gather shape (chunk size, programs, chunks in flight):

        fetch = fixed_s + 2 x slots x chunk_bytes / copy_Bps + rounds x (hit_s (1 - p) + miss_s p + mix_s p (1 - p))

    rounds = ceil(slots / (programs x in_flight)), p = the layer's miss share (chunks read from the host
    / slots). copy_Bps: the copy of the previous selection into the spare, read + write counted, from
    the records' copy_ms (least squares, its intercept left to fixed_s); the other four by least squares
    on fetch_ms minus that copy, relative (each record weighted by 1 / fetch_ms). fixed_s: the reuse
    plan (53-68 us measured alone) and the other fixed parts; mix_s: a round that holds both a hit and a
    miss waits for the miss (p (1 - p) is the share of such rounds, up to a constant)."""
    fixed_s: float
    copy_Bps: float
    hit_s: float
    miss_s: float
    mix_s: float
    records: int
    rel_residuals: tuple      # (context, batch, miss_rate, fitted / measured - 1) per record
    source: str = ""

    @property
    def max_rel_residual(self) -> float:
        return max(abs(r[-1]) for r in self.rel_residuals)

    def fetch_s(self, slots: int, chunk_bytes: int, rounds: int, p: float) -> float:
        return (self.fixed_s + 2 * slots * chunk_bytes / self.copy_Bps
                + rounds * (self.hit_s * (1 - p) + self.miss_s * p + self.mix_s * p * (1 - p)))

    def describe(self) -> str:
        worst = max(self.rel_residuals, key=lambda r: abs(r[-1]))
        return (f"fetch = {self.fixed_s * 1e6:.1f} us + 2 x slots x chunk / {self.copy_Bps / 1e9:.0f} GB/s + rounds x"
                f" ({self.hit_s * 1e6:.3f} (1 - p) + {self.miss_s * 1e6:.3f} p + {self.mix_s * 1e6:.3f} p (1 - p)) us,"
                f" p = miss share; {self.records} records{', ' + self.source if self.source else ''}; max |relative"
                f" residual| {self.max_rel_residual:.1%} ({worst[0] // 1024}K batch {worst[1]}, miss {worst[2]:g})")


@dataclass(frozen=True)
class CacheFill:
    """dualdecoder-cache's fill: the GPU chunk cache's lookup, LRU eviction and miss plan (kernels/engine/
    chunkcache.py ChunkCache.fill), twice per layer and step (the prefetch fill and the urgent fill; once, the urgent
    fill, for lru-cache, which prefetches nothing):

        fill_s(batch, slots) = fixed_s + per_slot_s * slots + per_request_s * batch + per_request_slot_s * batch * slots

    (per_slot_s: the scan of one (request, KV head)'s slots by one program, the step's latency where the
    programs are fewer than the SMs; per_request_slot_s: the scans' total work where they are not)

    one fill of one layer, seconds; fitted by sim/fit/cachefill.py. `sources`: the engine sweeps it was
    fitted to (each folder, run_id, git sha, date); empty while it is being fitted (no note then)."""
    theta: dict               # CACHE_FILL_TERMS -> seconds
    contexts: tuple = ()      # the contexts of the sweeps it was fitted at (other sweeps and contexts held out)
    points: int = 0
    max_abs_residual_us: float = 0.0
    residuals_us: dict = field(default_factory=dict)
    sources: tuple = ()
    model: str = ""
    gpu: str = ""

    def fill_s(self, batch: int, slots: int) -> float:
        return float(features(batch, slots) @ np.array([self.theta[t] for t in CACHE_FILL_TERMS]))

    def describe(self) -> str:
        th = self.theta
        where = ", ".join(f"{s.get('folder')} git {str(s.get('git_sha'))[:7]}" for s in self.sources)
        return (f"cache fill FITTED to {self.points} engine points of {CACHE_FILL_DESIGN} at"
                f" {'/'.join(f'{c // 1024}K' for c in self.contexts)} ({where}; other sweeps held out):"
                f" {th['fixed_s'] * 1e6:.1f} us + {th['per_slot_s'] * 1e9:.1f} ns per slot"
                f" + {th['per_request_s'] * 1e9:.0f} ns per request"
                f" + {th['per_request_slot_s'] * 1e12:.2f} ps per request-slot, per fill (twice per layer for dualdecoder-cache, once for lru-cache);"
                f" max |residual| {self.max_abs_residual_us:.1f} us per fill")


def features(batch: int, slots: int) -> np.ndarray:
    """The cache fill's features: (1, slots, batch, batch x slots)."""
    return np.array([1.0, float(slots), float(batch), float(batch) * float(slots)])


@dataclass(frozen=True)
class Fitted:
    """What a cost model prices with beyond its bundle's tables: the three fits (each may be absent),
    where they came from (`path`, `inputs`, `provenance`), and why a part is absent (`why`)."""
    engine: EngineFit | None = None
    reuse: dict = field(default_factory=dict)     # (chunk_bytes, programs, in_flight) -> ReuseFetchFit
    cache_fill: CacheFill | None = None
    path: str = ""                # as outputs name it (traces/fit/<gpu>/fitted.json)
    inputs: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    why: str = ""                 # why nothing (or no engine terms) came from a file
    # older engines' fills (traces/fit/engine-versions.json: cache_fill torch, before the fused one, and fused-int64,
    # before the int32 keys): each prices only that engine's chunk-cache rows in the validation
    cache_fill_torch: CacheFill | None = None
    cache_fill_int64: CacheFill | None = None

    @property
    def shown(self) -> str:
        return self.path or "no fitted-parameters file"


# --------------------------------------------------------------------------- inputs: what a file was fitted to

@lru_cache(maxsize=256)
def _sha256(path: str, mtime_ns: int, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256(path: str) -> str | None:
    """The file's sha256 (cached by path, mtime and size), None where it cannot be read."""
    try:
        st = os.stat(path)
        return _sha256(os.path.realpath(path), st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def bundle_files(folder: str) -> dict:
    """file name -> sha256 of what load_bundle reads of a bundle folder: bundle.json and its sections' CSVs."""
    from ddbench.core.sections import SECTIONS
    names = ["bundle.json"] + sorted({s["file"] for s in SECTIONS.values()})
    out = {}
    for n in names:
        h = sha256(os.path.join(folder, n))
        if h is not None:
            out[n] = h
    return out


def breakdown_sha(bundle) -> str | None:
    bd = getattr(bundle, "breakdown", None)
    return sha256(bd["path"]) if bd else None


def _mismatch(recorded: dict, now: dict) -> str | None:
    """The first file whose sha256 differs (or that is missing on one side), else None."""
    for n in sorted(set(recorded) | set(now)):
        if recorded.get(n) != now.get(n):
            return n + (" is not in the bundle" if n not in now else " was not fitted" if n not in recorded
                        else " differs")
    return None


# --------------------------------------------------------------------------- the file

def fitted_path(gpu: str, root: str | None = None) -> str:
    """<data root>/fit/<gpu>/fitted.json (root: another data root)."""
    from ddbench.core.paths import traces_dir
    return os.path.join(str(root), FOLDER, gpu, FILE) if root else str(traces_dir(FOLDER, gpu, FILE))


def candidates(bundle) -> list[str]:
    """Where a bundle's fitted parameters may be: beside its own data root (<calibration root>/../fit/<gpu>/),
    then the data root's."""
    own_root = os.path.dirname(os.path.dirname(os.path.abspath(bundle.path)))
    out = [fitted_path(bundle.gpu, own_root)]
    try:
        out.append(fitted_path(bundle.gpu))
    except DDBenchError:
        pass
    seen = []
    for p in out:
        if os.path.realpath(p) not in [os.path.realpath(q) for q in seen]:
            seen.append(p)
    return seen


def for_bundle(bundle) -> Fitted:
    """The fitted parameters of this bundle (module doc); an empty Fitted with `why` where there are none."""
    from ddbench.core.calibration import shown_path
    why = []
    files = bundle_files(bundle.path)
    for path in candidates(bundle):
        if not os.path.exists(path):
            continue
        f = load(path)
        bad = _mismatch(f.inputs.get("bundle", {}).get("files", {}), files)
        if bad:
            why.append(f"{f.path} was fitted to another bundle ({bad})")
            continue
        if f.engine is not None and f.inputs.get("breakdown", {}).get("sha256") != breakdown_sha(bundle):
            return Fitted(None, f.reuse, f.cache_fill, f.path, f.inputs, f.provenance,
                          f"{f.path}'s engine terms were fitted to another engine breakdown than the bundle's"
                          f" ({shown_path(bundle.breakdown['path']) if bundle.breakdown else 'none found'})",
                          f.cache_fill_torch, f.cache_fill_int64)
        return f
    return Fitted(why="; ".join(why) or f"no {FOLDER}/{bundle.gpu}/{FILE} beside the bundle or in the data root")


def _bad(path: str, where: str, what: str) -> DDBenchError:
    return DDBenchError(f"malformed fitted parameters {path}: field {where}: {what}")


def _num(doc, key, path, where, positive=False, nonneg=False, integer=False):
    x = doc.get(key) if isinstance(doc, dict) else None
    w = f"{where}.{key}" if where else key
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        raise _bad(path, w, f"{x!r} is not a finite number" if key in (doc or {}) else "missing")
    if integer and x != int(x):
        raise _bad(path, w, f"{x!r} is not an integer")
    if positive and x <= 0:
        raise _bad(path, w, f"{x!r} must be > 0")
    if nonneg and x < 0:
        raise _bad(path, w, f"{x!r} must be >= 0")
    return int(x) if integer else float(x)


def _obj(doc, key, path, where="", kind=dict, optional=False):
    x = doc.get(key) if isinstance(doc, dict) else None
    w = f"{where}.{key}" if where else key
    if x is None and optional:
        return None
    if not isinstance(x, kind):
        raise _bad(path, w, "missing" if x is None else f"not a{'n object' if kind is dict else ' list'}")
    return x


def _residuals(doc, key, path, where, arity):
    out = []
    for i, r in enumerate(_obj(doc, key, path, where, list)):
        if not isinstance(r, list) or len(r) != arity or isinstance(r[-1], bool) \
                or not isinstance(r[-1], (int, float)) or not math.isfinite(r[-1]):
            raise _bad(path, f"{where}.{key}[{i}]", f"not a list of {arity} ending in a finite number")
        out.append(tuple(r))
    return tuple(out)


def _engine(doc, path) -> EngineFit | None:
    e = _obj(doc, "engine", path, optional=True)
    if e is None:
        return None
    th = _obj(e, "theta", path, "engine")
    theta = {}
    for c, names in ENGINE_TERMS.items():
        v = _obj(th, c, path, "engine.theta", list)
        if len(v) != len(names):
            raise _bad(path, f"engine.theta.{c}", f"{len(v)} parameters, not {len(names)} ({', '.join(names)})")
        theta[c] = tuple(_num({"v": x}, "v", path, f"engine.theta.{c}[{i}]", nonneg=True) for i, x in enumerate(v))
    if set(th) != set(ENGINE_TERMS):
        raise _bad(path, "engine.theta", f"categories {sorted(th)}, not {sorted(ENGINE_TERMS)}")
    quant = _obj(e, "quant", path, "engine", list)
    return EngineFit(theta, _residuals(e, "residuals", path, "engine", 3),
                     _residuals(e, "step_residuals", path, "engine", 2),
                     _residuals(e, "floor_residuals", path, "engine", 2),
                     _num(e, "points", path, "engine", positive=True, integer=True), tuple(quant),
                     str(e.get("source", "")), bool(e.get("joint", False)))


def _reuse(doc, path) -> dict:
    out = {}
    for i, r in enumerate(_obj(doc, "reuse_fetch", path, kind=list)):
        w = f"reuse_fetch[{i}]"
        key = tuple(_num(r, k, path, w, positive=True, integer=True) for k in ("chunk_bytes", "programs", "in_flight"))
        out[key] = ReuseFetchFit(_num(r, "fixed_s", path, w), _num(r, "copy_Bps", path, w, positive=True),
                                 _num(r, "hit_s", path, w), _num(r, "miss_s", path, w), _num(r, "mix_s", path, w),
                                 _num(r, "records", path, w, positive=True, integer=True),
                                 _residuals(r, "rel_residuals", path, w, 4), str(r.get("source", "")))
    return out


def _cache_fill(doc, path, key: str = "cache_fill") -> CacheFill | None:
    c = _obj(doc, key, path, optional=True)
    if c is None:
        return None
    th = _obj(c, "theta", path, key)
    if set(th) != set(CACHE_FILL_TERMS):
        raise _bad(path, f"{key}.theta", f"must hold {', '.join(CACHE_FILL_TERMS)}")
    theta = {t: _num(th, t, path, f"{key}.theta", nonneg=True) for t in CACHE_FILL_TERMS}
    ctx = c.get("contexts")
    if not isinstance(ctx, list) or not ctx or not all(isinstance(x, int) and x > 0 for x in ctx):
        raise _bad(path, f"{key}.contexts", "must be a list of positive token counts")
    src = c.get("sources")
    if not isinstance(src, list) or not src or not all(isinstance(x, dict) for x in src):
        raise _bad(path, f"{key}.sources", "must be a list of the sweeps fitted to")
    return CacheFill(theta, tuple(ctx), _num(c, "points", path, key, positive=True, integer=True),
                     _num(c, "max_abs_residual_us", path, key, nonneg=True),
                     dict(_obj(c, "residuals_us", path, key)), tuple(dict(x) for x in src),
                     str(c.get("model", "")), str(c.get("gpu", "")))


def load(path: str) -> Fitted:
    """A fitted-parameters file, validated; any defect is a one-line DDBenchError naming the file and field."""
    from ddbench.core.calibration import shown_path
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except OSError as exc:
        raise DDBenchError(f"cannot read the fitted parameters {path}: {exc.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise DDBenchError(f"malformed fitted parameters {path}: {where}") from None
    if not isinstance(doc, dict):
        raise DDBenchError(f"malformed fitted parameters {path}: the top level is not an object")
    if doc.get("schema") != SCHEMA:
        raise _bad(path, "schema", f"{doc.get('schema')!r}, this ddbench reads {SCHEMA}")
    inputs = _obj(doc, "inputs", path)
    _obj(_obj(inputs, "bundle", path, "inputs"), "files", path, "inputs.bundle")
    return Fitted(_engine(doc, path), _reuse(doc, path), _cache_fill(doc, path), shown_path(path), inputs,
                  dict(_obj(doc, "provenance", path)), cache_fill_torch=_cache_fill(doc, path, "cache_fill_torch"),
                  cache_fill_int64=_cache_fill(doc, path, "cache_fill_int64"))


# --------------------------------------------------------------------------- writing (sim/fit/ builds the dict)

def engine_doc(f: EngineFit) -> dict:
    return {"theta": {c: list(v) for c, v in f.theta.items()}, "residuals": [list(r) for r in f.residuals],
            "step_residuals": [list(r) for r in f.step_residuals],
            "floor_residuals": [list(r) for r in f.floor_residuals], "points": f.points, "quant": list(f.quant),
            "source": f.source, "joint": f.joint}


def reuse_doc(key: tuple, f: ReuseFetchFit) -> dict:
    return {"chunk_bytes": key[0], "programs": key[1], "in_flight": key[2], "fixed_s": f.fixed_s,
            "copy_Bps": f.copy_Bps, "hit_s": f.hit_s, "miss_s": f.miss_s, "mix_s": f.mix_s, "records": f.records,
            "max_abs_rel_residual": f.max_rel_residual, "rel_residuals": [list(r) for r in f.rel_residuals],
            "source": f.source,
            "engine_step": "copy-then-regather: the engine before its in-place ShadowKV step; prices only that"
                           " engine's ShadowKV rows in the validation (sim/fit/replay.py legacy_reuse_fetch)"}


def cache_fill_doc(f: CacheFill) -> dict:
    return {"design": CACHE_FILL_DESIGN, "model": f.model, "gpu": f.gpu, "contexts": list(f.contexts), "points": f.points,
            "terms": "fill_s = fixed_s + per_slot_s * slots + per_request_s * batch + per_request_slot_s * batch * slots (one fill of"
                     " one layer; two per layer and step)",
            "theta": dict(f.theta), "max_abs_residual_us": f.max_abs_residual_us, "residuals_us": dict(f.residuals_us),
            "sources": list(f.sources)}
