"""The one fitted-parameters file of a calibration bundle: fit every term, record what it was fitted to,
write it, and tell whether it is stale.

    python -m ddbench.sim.fit [--gpu h200] [--calibration ROOT] [--cache-sweep DIR[,DIR]|none]
                      [--int64-fill-sweep DIR[,DIR]|none] [--torch-fill-sweep DIR[,DIR]|none]
                      [--context 32k,64k,128k] [--out FOLDER] [--check]

fits, in this order, on the bundle of --gpu (sim/fitted.py says what each term is):
  1. the decode compute reconciled with the engine (sim/fit/enginefit.py), from the bundle's engine
     section and the engine breakdown that belongs to it (ddbench.core.calibration.find_breakdown);
  2. ShadowKV's reuse fetch per gather shape (sim/fit/reusefit.py), from the bundle's reuse_fetch records
     (the copy-then-regather fetch of the engine before its in-place ShadowKV step: it prices that engine's rows in the validation);
  3. dualdecoder-cache's fill (sim/fit/cachefill.py), from the engine's chunk-cache sweeps of its fill
     (default <data root>/engine/<gpu>-compare where it exists) at the contexts of --context, priced with 1
     and 2; and the fills of the engine before it, which price only that engine's rows in the validation:
     the fused fill with int64 keys (<gpu>-cache-fill, same contexts) and the torch fill (<gpu>-cache, 64K);
and writes FOLDER/fitted.json (default <calibration root>/../fit/<gpu>/: traces/fit/h200/fitted.json)
through the output guard: the three fits with their residuals, the sha256 of every input file, and the
command, git sha and date. --check fits nothing: it says whether the file's inputs are still the files
it names (exit 0), or which changed (exit 1). The cost model only loads the file (sim/fitted.py).
"""

from __future__ import annotations

import os
import sys

from ddbench.core.flags import OneLineParser
from ddbench.core.errors import DDBenchError
from ddbench.sim.fit import cachefill, enginefit, reusefit
from ddbench.sim.fit.replay import FUSED, FUSED64, LINK, MODEL, TORCH, rel
from ddbench.sim.fitted import (COMMAND, FILE, SCHEMA, Fitted, bundle_files, cache_fill_doc, engine_doc, fitted_path, load,
                        reuse_doc, sha256)

SWEEP_FILES = ("engine.csv", "meta.json")
TORCH_FILL_ENGINE = ("the torch fill of an older engine (cache_fill torch in traces/fit/engine-versions.json), before"
                     " the fused fill; prices only that engine's rows in the validation")
INT64_FILL_ENGINE = ("the fused fill with int64 sort keys of an older engine (cache_fill fused-int64 in"
                     " traces/fit/engine-versions.json), before the int32 keys and pass 1's 16 splits; prices only"
                     " that engine's rows in the validation")


def _files(folder: str, names) -> dict:
    return {n: sha256(os.path.join(folder, n)) for n in names if sha256(os.path.join(folder, n)) is not None}


def _sweeps(dirs) -> list | None:
    return [{"path": rel(d), "files": _files(d, SWEEP_FILES)} for d in dirs] if dirs else None


def inputs_of(bundle, cache_dirs, torch_dirs=None, int64_dirs=None) -> dict:
    """What a fit of `bundle` reads, each file with its sha256 (paths as outputs name them: traces/...)."""
    bd = bundle.breakdown
    return {"bundle": {"path": rel(bundle.path), "files": bundle_files(bundle.path)},
            "breakdown": {"path": rel(bd["path"]), "sha256": sha256(bd["path"])} if bd else None,
            "cache_sweeps": _sweeps(cache_dirs), "int64_fill_sweeps": _sweeps(int64_dirs),
            "torch_fill_sweeps": _sweeps(torch_dirs)}


def default_cache_sweeps(gpu: str, kind: str = FUSED) -> list | None:
    """The kind's default chunk-cache sweeps (cachefill.SWEEPS) that exist in the data root, or None."""
    from ddbench.core.paths import traces_dir
    dirs = [str(traces_dir("engine", f"{gpu}-{it}")) for it in cachefill.SWEEPS[kind]]
    return [d for d in dirs if os.path.exists(os.path.join(d, "engine.csv"))] or None


def fit_bundle(bundle, cache_dirs, contexts=None, torch_dirs=None, int64_dirs=None) -> Fitted:
    """The fits of a bundle (module doc), in memory: the engine's fill to `cache_dirs` and its int64-key fill to
    `int64_dirs` at `contexts` (default cachefill.DEFAULT_CONTEXTS), the torch fill to `torch_dirs` at its
    default context."""
    from ddbench.core.catalog import get_gpu, get_link, get_model
    from ddbench.sim.costmodel import CostModel
    fitted = Fitted(enginefit.fit_bundle(bundle), reusefit.fit_bundle(bundle))
    fills = {}
    for kind, dirs, ctx in ((FUSED, cache_dirs, contexts), (FUSED64, int64_dirs, contexts), (TORCH, torch_dirs, None)):
        if dirs:
            cm = CostModel(get_model(MODEL), get_gpu(bundle.gpu), get_link(LINK), bundle, fitted=fitted)
            fills[kind] = cachefill.fit(dirs, cm, ctx, kind)
    return Fitted(fitted.engine, fitted.reuse, fills.get(FUSED), cache_fill_torch=fills.get(TORCH),
                  cache_fill_int64=fills.get(FUSED64))


def document(bundle, fitted: Fitted, cache_dirs, command: str, torch_dirs=None, int64_dirs=None) -> dict:
    """The fitted-parameters file's content (sim/fitted.py load reads it back)."""
    from ddbench.core.provenance import git_sha, utc_now, version
    return {
        "schema": SCHEMA, "gpu": bundle.gpu,
        "about": "fitted once by `python -m ddbench.sim.fit`; the cost model (sim/costmodel.py) loads it where the bundle's"
                 " files are the inputs' (sha256); docs/simulator.md",
        "provenance": {"command": command, "git_sha": git_sha(), "ddbench_version": version(),
                       "date_utc": utc_now()},
        "inputs": inputs_of(bundle, cache_dirs, torch_dirs, int64_dirs),
        "engine": engine_doc(fitted.engine) if fitted.engine else None,
        "reuse_fetch": [reuse_doc(k, f) for k, f in sorted(fitted.reuse.items())],
        "cache_fill": cache_fill_doc(fitted.cache_fill) if fitted.cache_fill else None,
        "cache_fill_int64": dict(cache_fill_doc(fitted.cache_fill_int64), engine=INT64_FILL_ENGINE)
        if fitted.cache_fill_int64 else None,
        "cache_fill_torch": dict(cache_fill_doc(fitted.cache_fill_torch), engine=TORCH_FILL_ENGINE)
        if fitted.cache_fill_torch else None,
    }


def stale(path: str) -> list[str]:
    """The inputs of a fitted-parameters file that are no longer the files it was fitted to ([]: fresh)."""
    from ddbench.core.paths import traces_dir
    f = load(path)
    base = str(traces_dir().parent)
    out = []

    def where(p):
        return p if os.path.isabs(p) else os.path.join(base, p)
    for role, xs in f.inputs.items():
        for x in (xs if isinstance(xs, list) else [xs] if xs else []):
            out += _stale_one(role, x, where)
    return out


def _stale_one(role: str, x: dict, where) -> list[str]:
    """The files of one input (a folder with its files' sha256, or one file) that changed."""
    if "files" not in x:
        return [] if sha256(where(x["path"])) == x.get("sha256") else [x["path"]]
    now = _files(where(x["path"]), x["files"])
    out = [f"{x['path']}/{n}" for n, h in sorted(x["files"].items()) if now.get(n) != h]
    if role == "bundle":
        extra = sorted(set(bundle_files(where(x["path"]))) - set(x["files"]))
        out += [f"{x['path']}/{n} (not fitted)" for n in extra]
    return out


def main(argv=None) -> int:
    from ddbench.core.calibration import find_bundle, load_bundle
    from ddbench.core.outputs import output_folder
    from ddbench.core.provenance import command_line
    from ddbench.core.units import parse_tokens
    ap = OneLineParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200", help="the calibration bundle's GPU (default h200)")
    ap.add_argument("--calibration", help="the calibration root holding <gpu>/ (default the data root's calibration/)")
    ap.add_argument("--cache-sweep", help="the chunk-cache engine sweeps the engine's fill is fitted to, comma-separated"
                                          " (default the data root's engine/<gpu>-compare where it exists;"
                                          " 'none': no fill term)")
    ap.add_argument("--int64-fill-sweep", help="the chunk-cache sweeps of the engine's fused fill with int64 keys"
                                               " (an older engine), which price that engine's rows in the validation"
                                               " (default the data root's engine/<gpu>-cache-fill where it exists;"
                                               " 'none': not fitted)")
    ap.add_argument("--torch-fill-sweep", help="the chunk-cache sweep of the engine's torch fill (before the fused one),"
                                               " which prices that engine's rows in the validation (default the"
                                               " data root's engine/<gpu>-cache where it exists; 'none': not fitted)")
    ap.add_argument("--context", default="32k,64k,128k",
                    help="the contexts of those sweeps whose points the fused fills are fitted to (32k,64k,128k)")
    ap.add_argument("--out", help=f"the folder of {FILE} (default <calibration root>/../fit/<gpu>/)")
    ap.add_argument("--force", action="store_true", help="write into a folder that holds other files (kept)")
    ap.add_argument("--check", action="store_true", help="fit nothing: exit 1 where the file's inputs changed")
    a = ap.parse_args(argv)
    try:
        path = find_bundle(a.gpu, a.calibration)
        if path is None:
            raise DDBenchError(f"no calibration bundle for {a.gpu} under {a.calibration or 'the data root'}")
        out = a.out or os.path.dirname(fitted_path(a.gpu, os.path.dirname(os.path.dirname(os.path.abspath(path)))))
        if a.check:
            bad = stale(os.path.join(out, FILE))
            for b in bad:
                print(f"stale: {b} changed since {os.path.join(out, FILE)} was fitted", file=sys.stderr)
            print("fresh" if not bad else f"{len(bad)} input(s) changed: rerun `{COMMAND}`")
            return 1 if bad else 0
        cache_dirs = _dirs(a.cache_sweep, "--cache-sweep", a.gpu, FUSED)
        torch_dirs = _dirs(a.torch_fill_sweep, "--torch-fill-sweep", a.gpu, TORCH)
        int64_dirs = _dirs(a.int64_fill_sweep, "--int64-fill-sweep", a.gpu, FUSED64)
        contexts = tuple(parse_tokens(c.strip(), "--context") for c in a.context.split(","))
        bundle = load_bundle(path)
        with output_folder(out, command=COMMAND, own_ok=True, force=a.force) as w:
            w.claim([FILE])
            fitted = fit_bundle(bundle, cache_dirs, contexts, torch_dirs, int64_dirs)
            w.write_json(FILE, document(bundle, fitted, cache_dirs, command_line(COMMAND, argv), torch_dirs, int64_dirs))
    except DDBenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in describe(fitted):
        print(line)
    print(f"wrote {os.path.join(out, FILE)}")
    return 0


def _dirs(text: str | None, flag: str, gpu: str, kind: str) -> list | None:
    """The sweeps of `flag`: None for 'none', the kind's defaults where not given, else its comma-separated
    folders (one without an engine.csv is an error)."""
    if text == "none":
        return None
    if not text:
        return default_cache_sweeps(gpu, kind)
    dirs = [d.strip() for d in text.split(",") if d.strip()]
    for d in dirs:
        if not os.path.exists(os.path.join(d, "engine.csv")):
            raise DDBenchError(f"{flag}: {d} holds no engine.csv (an engine sweep's folder)")
    return dirs


def describe(f: Fitted) -> list[str]:
    lines = [f.engine.describe() if f.engine else "decode compute: no engine breakdown for this bundle, not fitted"]
    lines += [f"ShadowKV's copy-then-regather fetch (the engine before its in-place ShadowKV step) at {k[0]} B chunks, {k[1]} programs x {k[2]}: {x.describe()}"
              for k, x in sorted(f.reuse.items())] or ["ShadowKV's fetch: no reuse_fetch records, not fitted"]
    lines.append(f.cache_fill.describe() if f.cache_fill else "cache fill: no chunk-cache sweep, not fitted")
    if f.cache_fill_int64:
        lines.append(f"{INT64_FILL_ENGINE}: " + f.cache_fill_int64.describe())
    if f.cache_fill_torch:
        lines.append(f"{TORCH_FILL_ENGINE}: " + f.cache_fill_torch.describe())
    return lines
