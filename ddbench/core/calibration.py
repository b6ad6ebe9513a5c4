"""Calibration bundles: the contract between `ddbench calibrate` (GPU) and the cost model (CPU).

A bundle is a folder `traces/calibration/<gpu>/` holding

    bundle.json       schema_version, the catalog GPU name, provenance, and per section its
                      file, row count and whether it is complete
    link.csv          link bandwidth by method, direction, transfer size and chunk size
    linear.csv        latency of every linear layer of the catalog models, keyed by shape (k, n, m)
    kernels.csv       latency of decode kernels (attention, selection, key rebuild...) keyed by shape
    interference.csv  urgent-versus-background transfers, and a GEMM beside a background gather
    ceilings.csv      HBM copy bandwidth and the dense bf16 GEMM rate measured in the same run
    engine.csv        the decode-step engine's compute-only step (CUDA graph, no transfers) per design,
                      batch and context, imported from an engine sweep (kernels/engine/sweep.py, its
                      `floor` phase; `layer` = "step": the whole step, LM head included)
    reuse_fetch.csv   optional: ShadowKV's fetch of one layer alone (kernels/engine/sweep.py, its
                      `reuse-fetch` phase: the engine's reuse_fetch as one CUDA graph of 32 layers'
                      fetches): per context, batch and forced miss rate, ms per layer of the device
                      copy into the spare, the reuse plan alone, the gather (its plan included) and the
                      whole fetch; slots and missed chunks per layer, chunk size, the gather's launch.
                      Imported with the engine section when the sweep has it (older sweeps do not).

Beside the bundle, loading also reads the decode-step engine's kernel breakdown (`breakdown.json`,
kernels/engine/breakdown.py: kernel time per category of compute-only CUDA-graph steps) where one
belongs to the bundle: `<bundle>/breakdown.json`, else the engine sweep folder of the same data root,
`<calibration root>/../engine/<gpu>/breakdown.json`, measured on the bundle's GPU (`Bundle.breakdown`;
None where there is none). The cost model fits its decode-step terms to it (sim/costmodel.py).

Every number is a measurement with its unit in the column name. Loading validates bundle.json and
every row against the typed schemas of ddbench/core/schemas.py (pydantic); no torch, no simpy: the
simulator and the GPU side both import this module.

Writing (`BundleWriter`) is incremental and resumable: each finished measurement is appended
and its CSV rewritten atomically, so an interrupted `ddbench calibrate` loses at most the
measurement in flight, and a rerun skips every row already present.
"""

from __future__ import annotations

import csv
import json
import math
import os

from ddbench.core.designs import DESIGNS
from ddbench.core.enginepoint import EnginePoint
from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir
from ddbench.core.io import rows_csv, write_json, write_text
from ddbench.core.sections import PROVENANCE_KEYS, SECTIONS, STRING_COLUMNS, columns  # noqa: F401  (re-exported)

SCHEMA_VERSION = 1

def _fmt(value) -> str:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else "nan"
    return str(value)


def _render_csv(section: str, rows: list[dict]) -> str:
    return rows_csv(rows, columns(section), fmt=_fmt, strict=True)


def _row_key(section: str, row: dict) -> tuple:
    return tuple(str(row[c]) for c in SECTIONS[section]["key"])


# --------------------------------------------------------------------------- loading

class Bundle:
    """A validated calibration bundle: rows per section plus provenance."""

    def __init__(self, path: str, meta: dict, rows: dict[str, list[dict]], breakdown: dict | None = None):
        self.path = path
        self.meta = meta
        self.rows = rows
        self.gpu = meta["gpu"]
        self.provenance = meta["provenance"]
        self.breakdown = breakdown      # load_breakdown's answer for this bundle's GPU, or None

    def complete(self, section: str) -> bool:
        return bool(self.meta["sections"].get(section, {}).get("complete"))

    def describe(self) -> str:
        p = self.provenance
        return (f"calibration bundle {shown_path(self.path)} measured on {p.get('device_name')} "
                f"({p.get('date')}, git {str(p.get('git_sha'))[:10]})")


def shown_path(path: str) -> str:
    """A bundle's path as outputs name it: relative to the data root where it lies there (traces/...),
    so that no machine's absolute path lands in a trace; as given elsewhere."""
    from ddbench.core.paths import data_root
    try:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(data_root()))
    except (DDBenchError, ValueError):
        return str(path)
    return str(path) if rel.startswith("..") else os.path.join("traces", rel)


def _bad(path: str, why: str) -> DDBenchError:
    return DDBenchError(f"malformed calibration bundle {path}: {why}")


def _parse_csv(path: str, section: str, file: str) -> list[dict]:
    """The section's rows, each validated against its schema (ddbench.core.schemas)."""
    from ddbench.core.schemas import calibration_row_model, read_csv
    rows = read_csv(file, calibration_row_model(section), what="malformed calibration bundle file",
                    columns=columns(section), comment="\0", allow_empty=True)
    return [r.model_dump() for r in rows]


def load_bundle(path: str) -> Bundle:
    """Load and validate a bundle folder (bundle.json against schemas.BundleMeta, every section's
    rows against its schema); any defect is a one-line DDBenchError naming file, line and field."""
    from ddbench.core.schemas import BundleMeta, validate
    meta_file = os.path.join(path, "bundle.json")
    try:
        with open(meta_file, encoding="utf-8") as fh:
            meta = json.load(fh)
    except FileNotFoundError:
        raise DDBenchError(f"no calibration bundle at {path} (bundle.json missing)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(path, f"bundle.json is not valid JSON ({exc})") from None
    except OSError as exc:
        raise _bad(path, f"cannot read bundle.json: {exc.strerror}") from None
    if not isinstance(meta, dict):
        raise _bad(path, "bundle.json top level is not an object")
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise _bad(path, f"bundle.json, field schema_version: {meta.get('schema_version')!r}, this ddbench reads"
                         f" {SCHEMA_VERSION}")
    validate(BundleMeta, meta, f"malformed calibration bundle {path}: bundle.json")
    rows: dict[str, list[dict]] = {}
    for section, info in meta["sections"].items():
        file = os.path.join(path, SECTIONS[section]["file"])
        rows[section] = _parse_csv(path, section, file) if os.path.exists(file) else []
        if info.get("complete") and not rows[section]:
            raise _bad(path, f"section '{section}' is marked complete but has no rows")
    for section in SECTIONS:
        rows.setdefault(section, [])
    bd = find_breakdown(path, meta["gpu"])
    breakdown = load_breakdown(bd) if bd else None
    if breakdown is not None and breakdown["provenance"].get("gpu") != meta["provenance"].get("device_name"):
        breakdown = None      # another GPU's engine: not this bundle's
    return Bundle(path, meta, rows, breakdown)


# --------------------------------------------------------------------------- the engine's kernel breakdown

BREAKDOWN_FILE = "breakdown.json"     # kernels/engine/breakdown.py writes it into the engine sweep's folder
BREAKDOWN_CATEGORIES = ("gemm", "selection", "attention", "misses", "rebuild", "gather", "glue")


def find_breakdown(bundle_path: str, gpu: str) -> str | None:
    """The engine breakdown that belongs to a bundle folder: its own breakdown.json, else the engine
    sweep folder of the same data root (<calibration root>/../engine/<gpu>/breakdown.json); None."""
    own = os.path.join(bundle_path, BREAKDOWN_FILE)
    if os.path.exists(own):
        return own
    sibling = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(bundle_path))), "engine", gpu,
                           BREAKDOWN_FILE)
    return sibling if os.path.exists(sibling) else None


def load_breakdown(path: str) -> dict:
    """A breakdown.json (kernels/engine/breakdown.py), validated: {"path", "provenance", "points"}, the
    points that ran ('ok'; others are dropped), each {design, context, batch, step_ms, categories:
    {category: {ms, kernels}}} with every time a finite number >= 0. A defect is a one-line
    DDBenchError naming the file, the point and the field."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DDBenchError(f"malformed engine breakdown {path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise DDBenchError(f"cannot read the engine breakdown {path}: {exc.strerror}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise DDBenchError(f"malformed engine breakdown {path}: no 'points' list")
    prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}

    def num(x, what, i, positive=False):
        ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x > 0 if positive
                                                                                               else x >= 0)
        if not ok:
            raise DDBenchError(f"malformed engine breakdown {path}: point {i}, field {what}: {x!r} is not a finite"
                               f" number {'> 0' if positive else '>= 0'}")
        return x

    points = []
    for i, p in enumerate(doc["points"]):
        if not isinstance(p, dict):
            raise DDBenchError(f"malformed engine breakdown {path}: point {i} is not an object")
        if p.get("status", "ok") != "ok":
            continue
        if not isinstance(p.get("design"), str) or not p["design"]:
            raise DDBenchError(f"malformed engine breakdown {path}: point {i}, field design: missing")
        cats = p.get("categories")
        if not isinstance(cats, dict) or not cats:
            raise DDBenchError(f"malformed engine breakdown {path}: point {i}, field categories: missing")
        out = {}
        for c, v in cats.items():
            if c not in BREAKDOWN_CATEGORIES:
                raise DDBenchError(f"malformed engine breakdown {path}: point {i}, category {c!r} is not one of"
                                   f" {', '.join(BREAKDOWN_CATEGORIES)}")
            if not isinstance(v, dict):
                raise DDBenchError(f"malformed engine breakdown {path}: point {i}, category {c}: not an object")
            out[c] = {"ms": float(num(v.get("ms"), f"categories.{c}.ms", i)),
                      "kernels": float(num(v.get("kernels"), f"categories.{c}.kernels", i))}
        ctx, batch = p.get("context"), p.get("batch")
        for k, x in (("context", ctx), ("batch", batch)):
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise DDBenchError(f"malformed engine breakdown {path}: point {i}, field {k}: {x!r} is not a"
                                   " positive integer")
        points.append({"design": p["design"], "context": ctx, "batch": batch,
                       "step_ms": float(num(p.get("step_ms"), "step_ms", i, positive=True)), "categories": out})
    if not points:
        raise DDBenchError(f"malformed engine breakdown {path}: no point that ran ('ok')")
    return {"path": path, "provenance": prov, "points": points}


def bundle_dir(gpu: str, root: str | None = None) -> str:
    root = str(root or traces_dir("calibration"))
    return os.path.join(root, gpu)


def find_bundle(gpu: str, root: str | None = None) -> str | None:
    """The bundle folder for a catalog GPU name, or None where none was measured."""
    root = str(root or traces_dir("calibration"))
    path = bundle_dir(gpu, root)
    return path if os.path.exists(os.path.join(path, "bundle.json")) else None


def available_bundles(root: str | None = None) -> list[str]:
    root = str(root or traces_dir("calibration"))
    if not os.path.isdir(root):
        return []
    return sorted(d for d in os.listdir(root) if os.path.exists(os.path.join(root, d, "bundle.json")))


# --------------------------------------------------------------------------- writing

class BundleWriter:
    """Incremental, resumable writer. Rows already present are skipped by key (`have`)."""

    def __init__(self, path: str, gpu: str, provenance: dict, fresh: bool = False):
        self.path = path
        self.gpu = gpu
        self.rows: dict[str, list[dict]] = {s: [] for s in SECTIONS}
        self.keys: dict[str, set] = {s: set() for s in SECTIONS}
        self.sections: dict[str, dict] = {}
        self.resumed = 0
        if not fresh and os.path.exists(os.path.join(path, "bundle.json")):
            old = load_bundle(path)
            old_dev = old.provenance.get("device_name")
            if old.gpu != gpu or old_dev != provenance.get("device_name"):
                raise DDBenchError(f"{path} holds a bundle of {old_dev} ({old.gpu}); this GPU is "
                                   f"{provenance.get('device_name')} ({gpu}): use --fresh or another --out")
            for s, rows in old.rows.items():
                for r in rows:
                    self.rows[s].append(r)
                    self.keys[s].add(_row_key(s, r))
                    self.resumed += 1
            self.sections = {s: dict(v) for s, v in old.meta["sections"].items()}
            runs = list(old.provenance.get("runs", []))
            runs.append({k: provenance.get(k) for k in ("date", "git_sha", "command")})
            # the bundle's provenance stays its first run's (most rows are that run's); each run is in `runs`
            provenance = dict(old.provenance, runs=runs)
        else:
            provenance = dict(provenance, runs=[{k: provenance.get(k) for k in ("date", "git_sha", "command")}])
        self.provenance = provenance
        os.makedirs(path, exist_ok=True)
        self._write_meta()

    def have(self, section: str, **key) -> bool:
        return tuple(str(key[c]) for c in SECTIONS[section]["key"]) in self.keys[section]

    def add(self, section: str, row: dict) -> None:
        cols = columns(section)
        missing = [c for c in cols if c not in row]
        if missing:
            raise ValueError(f"{section} row lacks {missing}")
        k = _row_key(section, row)
        if k in self.keys[section]:
            return
        self.rows[section].append({c: row[c] for c in cols})
        self.keys[section].add(k)
        self.sections.setdefault(section, {"file": SECTIONS[section]["file"], "complete": False})
        self.sections[section]["rows"] = len(self.rows[section])
        write_text(os.path.join(self.path, SECTIONS[section]["file"]), _render_csv(section, self.rows[section]))
        self._write_meta()

    def complete(self, section: str, note: str = "") -> None:
        info = self.sections.setdefault(section, {"file": SECTIONS[section]["file"]})
        info["complete"] = True
        info["rows"] = len(self.rows[section])
        if note:
            info["note"] = note
        self._write_meta()

    def _write_meta(self) -> None:
        write_json(os.path.join(self.path, "bundle.json"), {
            "schema_version": SCHEMA_VERSION, "gpu": self.gpu,
            "units": "latency in ms, bandwidth in GB/s (1e9 B/s), sizes in bytes, rates in TFLOP/s",
            "provenance": self.provenance, "sections": self.sections})


# --------------------------------------------------------------------------- the engine section

ENGINE_MODEL = "llama-3-8b"


def _sweep_rows(path: str, what: str) -> list[dict]:
    """The rows of an engine sweep's CSV (comment lines skipped); one-line DDBenchError if unreadable."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(line for line in fh if not line.startswith("#")))
    except OSError as exc:
        raise DDBenchError(f"{path}: cannot read {what} ({exc.strerror})") from None


def engine_section_rows(engine_csv: str) -> list[dict]:
    """Bundle rows from an engine sweep's engine.csv: every 'ok' compute-only CUDA-graph step of its
    `floor` phase (no host reads, so nothing exposed and no bytes on the link). DualDecoder with one
    query token is named 'dualdecoder-single'. Steps with the model's own selection (miss rate
    'none') are layer 'step'; steps with a forced miss rate (the sweep harness draws the misses,
    kernels/engine/sweep.py) are layer 'step-forced-miss', so that their difference, the harness's
    per-step cost, can be added to forced-miss points (CostModel.engine_harness_s)."""
    rows = _sweep_rows(engine_csv, "the engine sweep")
    out = []
    for i, r in enumerate(rows, start=2):
        if r.get("phase") != "floor" or r.get("status") != "ok" or r.get("transfers") != "0" or r.get("graph") != "1":
            continue
        if r.get("model") not in (None, "", ENGINE_MODEL):
            continue                      # the bundle's engine section is the engine model's
        try:
            ms = float(r["step_ms"])
            batch, context = int(r["batch"]), int(r["context"])
        except (KeyError, ValueError):
            raise DDBenchError(f"{engine_csv}, line {i}: step_ms, batch or context is not a number") from None
        spec = DESIGNS.get(r["design"])       # a dual-token design run with one query token: '<design>-single'
        single = spec is not None and spec.tokens_per_step == 2 and r.get("tokens") == "1"
        name = EnginePoint.named(r["design"], single=single).design
        layer = "step" if r.get("miss_rate", "none") in ("none", "") else "step-forced-miss"
        out.append({"system": name, "model": ENGINE_MODEL, "batch": batch, "context": context, "layer": layer,
                    "compute_ms": ms, "exposed_transfer_ms": 0.0, "urgent_bytes": 0, "prefetch_bytes": 0})
    if not out:
        raise DDBenchError(f"{engine_csv}: no compute-only 'floor' rows (an engine sweep of kernels/engine/sweep.py)")
    return out


REUSE_FETCH_SWEEP_FILE = "reuse_fetch.csv"    # in the engine sweep's folder (kernels/engine/sweep.py)


def reuse_fetch_section_rows(reuse_csv: str) -> list[dict]:
    """Bundle rows from an engine sweep's reuse_fetch.csv (its `reuse-fetch` phase): every 'ok' row;
    link_bytes = link_mib in bytes (the bundle's sizes are bytes). One-line DDBenchError for a row
    whose numbers do not parse."""
    rows = _sweep_rows(reuse_csv, "the reuse-fetch records")
    out = []
    for i, r in enumerate(rows, start=2):
        if r.get("status") != "ok":
            continue
        try:
            row = {"system": r["design"], "model": ENGINE_MODEL, "context": int(r["context"]),
                   "batch": int(r["batch"]), "miss_rate": float(r["miss_rate"])}
            for c in ("fetch_ms", "copy_ms", "plan_ms", "gather_ms"):
                row[c] = float(r[c])
            for c in ("slots", "chunk_bytes", "programs", "items"):
                row[c] = int(r[c])
            row["miss_chunks"] = float(r["miss_chunks"])
            row["link_bytes"] = float(r["link_mib"]) * 2**20
        except (KeyError, TypeError, ValueError):
            raise DDBenchError(f"{reuse_csv}, line {i}: a reuse-fetch column is missing or not a number") from None
        bad = [c for c in SECTIONS["reuse_fetch"]["positive"] if not (math.isfinite(row[c]) and row[c] > 0)]
        bad += [c for c in SECTIONS["reuse_fetch"]["other"] if not (math.isfinite(row[c]) and row[c] >= 0)]
        if bad:
            raise DDBenchError(f"{reuse_csv}, line {i}: {bad[0]} must be a finite number "
                               f"{'> 0' if bad[0] in SECTIONS['reuse_fetch']['positive'] else '>= 0'}")
        out.append(row)
    return out


def _replace_section(writer: "BundleWriter", section: str, rows: list[dict]) -> None:
    writer.rows[section] = []
    writer.keys[section] = set()
    writer.sections.pop(section, None)
    for r in rows:
        writer.add(section, r)


def _sweep_source(folder: str) -> dict:
    try:
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as fh:
            meta = json.load(fh)
            return dict(meta.get("provenance", {}), run_id=meta.get("run_id"))
    except (OSError, ValueError, AttributeError):
        return {}


def add_engine_section(writer: "BundleWriter", engine_dir: str, reuse_dir: str | None = None) -> int:
    """Fill the engine section of a bundle being written from the engine sweep in `engine_dir`,
    replacing any engine rows it held (another sweep's); likewise the reuse_fetch section, from the
    reuse_fetch.csv of `reuse_dir` (default: the same sweep; a `--phases reuse-fetch` run may be
    another) where it has one (none: the bundle keeps no reuse-fetch records, not another sweep's).
    Returns the number of engine rows."""
    rows = engine_section_rows(os.path.join(engine_dir, "engine.csv"))
    reuse_dir = reuse_dir or engine_dir
    reuse_csv = os.path.join(reuse_dir, REUSE_FETCH_SWEEP_FILE)
    reuse = reuse_fetch_section_rows(reuse_csv) if os.path.exists(reuse_csv) else []
    _replace_section(writer, "engine", rows)
    _replace_section(writer, "reuse_fetch", reuse)
    if not reuse:
        stale = os.path.join(writer.path, SECTIONS["reuse_fetch"]["file"])
        if os.path.exists(stale):
            os.remove(stale)
    prov = _sweep_source(engine_dir)
    writer.complete("engine", note="compute-only decode step (CUDA graph, no transfers) of the engine sweep"
                                   f" {prov.get('git_sha', '?')} {prov.get('date_utc', '?')}: layer 'step' is the"
                                   " whole step, LM head included")
    source = {k: prov.get(k) for k in ("gpu", "git_sha", "date_utc", "command", "run_id")}
    writer.sections["engine"]["source"] = source
    if reuse:
        writer.complete("reuse_fetch", note="ShadowKV's fetch of one layer alone (the engine's reuse_fetch: values"
                                            " only, its gather launch), engine sweep phase 'reuse-fetch': ms per"
                                            " layer = median of CUDA-graph replays of 32 layers' calls / 32")
        rp = _sweep_source(reuse_dir)
        writer.sections["reuse_fetch"]["source"] = {k: rp.get(k) for k in source}
    writer._write_meta()
    return len(rows)


def import_engine_sweep(bundle_path: str, engine_dir: str, command: str, date: str,
                        reuse_dir: str | None = None) -> int:
    """Add an engine sweep to an existing bundle (CPU only: the sweep was measured on that GPU): its
    floor phase as the engine section, and its reuse-fetch records (or those of `reuse_dir`) as the
    reuse_fetch section where it has them."""
    old = load_bundle(bundle_path)
    prov = dict(old.provenance)
    prov.pop("runs", None)
    prov.update(date=date, command=command)
    return add_engine_section(BundleWriter(bundle_path, old.gpu, prov), engine_dir, reuse_dir)
