"""Example outputs in docs/*.md: each command is run here and its output printed as it is.

A block `<!-- generated: example-NAME -->` holds EXAMPLES[NAME]: the command as a user types it and
what it prints (stdout and stderr interleaved, as on a terminal), from a fresh temporary folder,
with the repository's traces as the data root. A block `<!-- generated: notes-NAME -->` is prose
whose numbers come from such a run (or from the engine's traces). So a change to the cost model, the
traces or the output format makes `python -m ddbench.doctables --check` fail until the docs are
regenerated. Every run is kept for the process (`_RUNS`), so a command shown and described is run
once, and in a cache folder keyed by the digest of everything its output depends on (the source of
ddbench and sim, the traces, the libraries' versions; `DDBENCH_DOCTABLES_CACHE`, `off` for none), so
an unchanged checkout checks its docs without running them again. The commands take seconds each.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from ddbench.core.defaults import FORCED_MISS
from ddbench.core.designs import DUALDECODER, SHADOWKV
from ddbench.doctables.common import ROOT, DocTablesError, read_engine_csv, read_trace_json, fmt_context, fmt_pct

PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent     # where this ddbench is imported from


@dataclass(frozen=True)
class Example:
    argv: tuple[str, ...]          # after `ddbench`
    rc: int = 0                    # the exit status it must end with


PLAN_FLEET = ("plan", "--model", "qwen2.5-32b", "--gpu", "h100-80gb", "--link", "pcie5", "--context",
              "uniform:64k:128k", "--output", "exp:256", "--slo", "p99-completion=120s,p99-tpot=100ms",
              "--design", "all", "--prefill", "elsewhere", "--target-rate", "20")
PLAN_SEARCH = ("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--output", "256",
               "--prefill", "elsewhere", "--slo", "p99-tpot=150ms", "--design", "shadowkv,dualdecoder",
               "--search", "budget,chunk,lowrank-layers,buffers", "--plot", "pareto.png")
ENGINE_HIT = "0.82422"             # the engine's forced miss rate, 45 of 256 chunks (17.6 %)
PLAN_ENGINE = ("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--output", "256",
               "--prefill", "elsewhere", "--hit-rate", ENGINE_HIT, "--slo", "p99-tpot=1s",
               "--design", "shadowkv,dualdecoder", "--verbose")

EXAMPLES = {
    "plan-memory": Example(("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k",
                            "--design", "all")),
    "plan-first": Example(("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k",
                           "--design", "shadowkv,dualdecoder")),
    "plan-host": Example(("plan", "--model", "llama-3-8b", "--gpu", "h100-80gb", "--context", "128k",
                          "--design", "all", "--host", "paper-testbed", "--verbose")),
    "plan-unmet": Example(("plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k", "--output",
                           "64", "--slo", "p99-tpot=5ms", "--design", "shadowkv,dualdecoder")),
    "plan-fleet": Example(PLAN_FLEET + ("--host", "paper-testbed", "--verbose")),
    "plan-tp": Example(("plan", "--model", "llama-3-70b", "--gpu", "h200", "--context", "64k", "--tp", "8",
                        "--design", "all")),
    "plan-longctx": Example(("plan", "--model", "qwen2.5-14b", "--gpu", "h100-80gb", "--context", "128k", "--output",
                             "256", "--slo", "p99-tpot=80ms,p99-ttft=30s", "--target-rate", "10", "--design", "all")),
    "plan-search": Example(PLAN_SEARCH),
    "plan-engine": Example(PLAN_ENGINE),
    "simulate-batch-sweep": Example(("simulate", "--model", "qwen2.5-32b", "--gpu", "a100-80gb", "--design",
                                     "shadowkv,dualdecoder", "--context", "64k", "--batch", "1:16:1", "--out",
                                     "sim-out/batch-sweep", "--plot", "batch-sweep.png")),
}

_RUNS: dict[tuple[str, tuple[str, ...]], tuple[int, str]] = {}
_DIGESTS: dict[str, str] = {}
CACHE_ENV = "DDBENCH_DOCTABLES_CACHE"      # a folder for the runs' outputs, or "off"; default ~/.cache/ddbench/doctables


def inputs_digest(root: Path) -> str:
    """sha256 over everything a command's output can depend on: the source of ddbench and sim as
    imported here, the traces under `root`, and the versions of Python and the libraries that compute."""
    if str(root) not in _DIGESTS:
        import hashlib
        from importlib import metadata
        h = hashlib.sha256()
        files = [(f"src/{p.relative_to(PACKAGE_ROOT)}", p) for pkg in ("ddbench", "sim")
                 for p in (PACKAGE_ROOT / pkg).rglob("*.py")]
        files += [(f"traces/{p.relative_to(root / 'traces')}", p) for p in (root / "traces").rglob("*") if p.is_file()]
        for name, path in sorted(files):
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
        for dist in ("numpy", "pandas", "simpy", "scipy", "matplotlib", "pydantic", "pyyaml"):
            try:
                h.update(f"{dist}={metadata.version(dist)}".encode())
            except metadata.PackageNotFoundError:
                h.update(f"{dist}=none".encode())
        h.update(sys.version.encode())
        _DIGESTS[str(root)] = h.hexdigest()
    return _DIGESTS[str(root)]


def _cache_file(root: Path, argv: tuple[str, ...]) -> Path | None:
    where = os.environ.get(CACHE_ENV, "")
    if where == "off":
        return None
    import hashlib
    folder = Path(where) if where else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddbench" / "doctables"
    key = hashlib.sha256((inputs_digest(root) + "\0" + "\0".join(argv)).encode()).hexdigest()[:32]
    return folder / f"{key}.txt"


def run_command(root: Path, argv: tuple[str, ...]) -> tuple[int, str]:
    """`ddbench ARGV` in a fresh temporary folder, the data root `root/traces`: (exit status, what it
    printed, stdout and stderr interleaved). Each command runs once per process, and once for the
    same inputs (`inputs_digest`) where a cache folder is writable (CACHE_ENV)."""
    key = (str(root), tuple(argv))
    cache = _cache_file(root, tuple(argv)) if key not in _RUNS else None
    if cache is not None and cache.is_file():
        rc, _, out = cache.read_text(encoding="utf-8").partition("\n")
        _RUNS[key] = (int(rc), out)
    if key not in _RUNS:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "DDBENCH_DATA")}
        env.update(PYTHONUNBUFFERED="1", DDBENCH_DATA=str((root / "traces").resolve()),
                   PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p]))
        with tempfile.TemporaryDirectory(prefix="ddbench-doc-") as tmp:
            r = subprocess.run([sys.executable, "-m", "ddbench", *argv], cwd=tmp, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        _RUNS[key] = (r.returncode, r.stdout)
        if cache is not None:
            try:
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
                tmp.write_text(f"{r.returncode}\n{r.stdout}", encoding="utf-8")
                tmp.replace(cache)
            except OSError:
                pass                        # no cache: the next process runs it again
    return _RUNS[key]


def _output(root: Path, ex: Example) -> str:
    rc, out = run_command(root, ex.argv)
    if rc != ex.rc:
        tail = " | ".join(out.strip().splitlines()[-3:])
        raise DocTablesError(f"`ddbench {shlex.join(ex.argv)}` exited {rc}, not {ex.rc}: {tail}")
    return out.rstrip("\n")


def shown(argv: tuple[str, ...], width: int = 104) -> str:
    """The command as the docs print it: `$ ddbench ...`, a flag beside its value, continued with ` \\`
    before `width`."""
    units, i = [], 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            units.append(f"{shlex.quote(argv[i])} {shlex.quote(argv[i + 1])}")
            i += 2
        else:
            units.append(shlex.quote(argv[i]))
            i += 1
    lines, line = [], "$ ddbench"
    for u in units:
        if len(line) + 1 + len(u) > width - 2:
            lines.append(line + " \\")
            line = "    " + u
        else:
            line += " " + u
    return "\n".join(lines + [line])


def example(name: str, root: Path = ROOT) -> str:
    ex = EXAMPLES[name]
    return "```\n" + shown(ex.argv) + "\n" + _output(root, ex) + "\n```"


# -- reading an output's tables -----------------------------------------------------------------

def _rank_rows(text: str) -> dict[str, list[str]]:
    """The ranking table of a `plan --slo` output: {design: its cells}, cells split on 2+ spaces."""
    lines = text.splitlines()
    head = next((i for i, ln in enumerate(lines) if ln.startswith("rank ")), None)
    if head is None:
        raise DocTablesError("no ranking table in the plan output")
    rows = {}
    for ln in lines[head + 1:]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) < 4 or not (cells[0].lstrip("=").isdigit() or cells[0] == "-"):   # =1: undecided
            break
        rows[cells[1]] = cells
    return rows


def _columns(text: str) -> list[str]:
    head = next(ln for ln in text.splitlines() if ln.startswith("rank "))
    return ["rank"] + re.split(r"\s{2,}", head[len("rank"):].strip())


def _cell(text: str, design: str, column: str) -> str:
    cols, rows = _columns(text), _rank_rows(text)
    if design not in rows:
        raise DocTablesError(f"no row for {design} in the plan output")
    return rows[design][cols.index(column)]


def _knob_rows(text: str) -> list[dict]:
    """The knob search's table (`plan --search`): one dict per shown setting."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("knob search (")), None)
    if start is None:
        raise DocTablesError("no knob-search table in the plan output")
    out = []
    for ln in lines[start + 2:]:
        if not ln.startswith("  ") or ln.startswith("  ("):
            break
        c = re.split(r"\s{2,}", ln.strip())
        out.append({"design": c[0], "setting": c[1], "rate": float(c[2]), "tok_s": float(c[3]),
                    "peak_gb": float(c[4]), "binding": c[6], "front": c[7] if len(c) > 7 else ""})
    return out


def _num(cell: str) -> float:
    return float(cell.replace(",", ""))


# -- notes: prose whose numbers come from a run -------------------------------------------------

def notes_plan_fleet(root: Path = ROOT) -> str:
    """Worked example 1's reading, from its output: the ranking, the fleet for the target rate, and what
    sharing the host's link costs each design at its max batch (the last columns)."""
    text = _output(root, EXAMPLES["plan-fleet"])
    cols, rows = _columns(text), _rank_rows(text)
    ranked = [r for r in rows.values() if r[0] != "-"]
    if not ranked:
        raise DocTablesError("worked example 1 ranks no design")
    rate = cols.index("max rate req/s per decode GPU")
    order = ", ".join(f"{r[1]} {r[rate]}" for r in ranked)
    alone, shared = cols.index("tok/s at max batch: alone"), cols.index("shared")
    cost = ", ".join(f"{r[1]} {_num(r[shared]) / _num(r[alone]) - 1:+.0%}" for r in rows.values()
                     if r[alone] not in ("-", "0"))
    fleet = next((ln for ln in text.splitlines() if ln.startswith("for 20 req/s: ")), None)
    out = f"Ranked by rate per decode GPU (req/s): {order}."
    if fleet:
        out += f" For the 20 req/s: {fleet[len('for 20 req/s: '):]}."
    return out + (" Sharing the host's link (8 GPUs fetching) changes each design's tokens/s at its max batch"
                  f" by: {cost}.")


def notes_plan_search(root: Path = ROOT) -> str:
    """Worked example 2's reading: what binds, budget 1024 against 2048, ShadowKV against DualDecoder,
    ping-pong against per-layer buffers, all from the output shown."""
    rows = _knob_rows(_output(root, EXAMPLES["plan-search"]))
    dd = [r for r in rows if r["design"] == DUALDECODER]
    sk = [r for r in rows if r["design"] == SHADOWKV]
    if not dd or not sk:
        raise DocTablesError("the knob search shows no dualdecoder or shadowkv setting")
    binds = sorted({r["binding"] for r in dd})
    best = {b: max((r for r in dd if f"budget={b} " in r["setting"] + " "), key=lambda r: r["rate"], default=None)
            for b in (1024, 2048)}
    out = [f"DualDecoder's shown settings are bound by {' and '.join(binds)}"]
    if best[1024] and best[2048]:
        out.append(f"budget 1024 gives {best[1024]['rate'] / best[2048]['rate']:.1f}x the rate of budget 2048"
                   " (fewer bytes per step)")
    top_sk, top_dd = max(sk, key=lambda r: r["rate"]), max(dd, key=lambda r: r["rate"])
    out.append(f"ShadowKV, bound by {top_sk['binding']}, reaches {top_sk['rate'] / top_dd['rate']:.1f}x"
               f" DualDecoder's best rate ({top_sk['setting']})")
    pp = [r for r in dd if r["setting"].endswith("buffers=pingpong")]
    for r in pp:
        twin = next((x for x in dd if x["setting"] == r["setting"].replace("pingpong", "per-layer")), None)
        if twin:
            same = abs(r["rate"] / twin["rate"] - 1) < 0.02
            rates = (f"the rate of per-layer buffers ({r['rate']:g} req/s)" if same else
                     f"{r['rate']:g} req/s against per-layer buffers' {twin['rate']:g}")
            out.append(f"at {r['setting'].replace(' buffers=pingpong', '')} ping-pong buffers give {rates},"
                       f" with {twin['peak_gb'] - r['peak_gb']:.1f} GB less peak memory")
            break
    return "From the output above: " + "; ".join(out) + "."


def alias_note(rows, gib: float | None, model: str = "llama-3-8b") -> str:
    """How the engine's host KV held these rows' batches: one pinned buffer of `gib` GiB (meta.json's
    host_gib), smaller than the batch's KV, so that layers (then requests) read the same host bytes."""
    buf = f"one pinned {gib:g} GiB buffer" if gib else "one pinned buffer (its size not recorded)"
    if "host_alias" in rows.columns and rows["host_alias"].notna().any():
        kinds = sorted({str(a) for a in rows["host_alias"] if str(a) not in ("none", "nan", "")})
        layers = sorted({int(h) for h in rows["host_layers"].dropna()})
        if not kinds:
            return f"host KV not aliased: {buf} holding the whole batch"
        n = "/".join(map(str, layers))
        out = (f"host KV aliased ({', '.join(kinds)}): {buf}, smaller than the batch's KV, holds {n} physical"
               f" layer{'' if layers == [1] else 's'} that every logical layer reads (l % host_layers)")
        if any("requests" in k for k in kinds):
            out += ", the requests in overlapping windows"
        return out + "; every chunk still crosses the link, only the values repeat"
    from ddbench.core.catalog import get_model
    from ddbench.core.designs import get_design
    from ddbench.core.memory import host_kv_bytes
    from ddbench.core.workload import Workload
    r = rows.iloc[0]
    need = int(r["batch"]) * host_kv_bytes(get_design(str(r["design"])), get_model(model),
                                           Workload(context=int(r["context"]))) / 2 ** 30
    if gib and need <= gib:
        return f"host KV not aliased: the batch's {need:,.0f} GiB of KV in {buf}"
    return (f"host KV aliased: the batch's {need:,.0f} GiB of KV read from {buf} (layers aliased,"
            " l % host_layers; every chunk still crosses the link, only the values repeat)")


def notes_plan_host(root: Path = ROOT) -> str:
    """The host-memory example's reading: which designs host memory holds below their GPU's batch."""
    text = _output(root, EXAMPLES["plan-host"])
    lines = text.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("system "))
    cols = re.split(r"\s{2,}", lines[head].strip())
    held, kept = [], []
    for ln in lines[head + 1:]:
        c = re.split(r"\s{2,}", ln.strip())
        if len(c) != len(cols):
            break
        r = dict(zip(cols, c))
        if r["by host"] == "-":
            continue
        (held if r["bound by"] == "host" else kept).append(r)
    out = "; ".join(f"{r['system']} to {r['max batch']} of the {r['by GPU']} its GPU memory fits" for r in held)
    keep = ", ".join(f"{r['system']} ({r['max batch']})" for r in kept)
    tail = f"; {keep}, pinning less per request, keep{'s' if len(kept) == 1 else ''} the GPU's batch" if keep else ""
    return f"On the paper's own testbed (1.6 TB for 8 GPUs) host memory holds {out or 'no design'} at 128K{tail}."


def notes_plan_engine(root: Path = ROOT) -> str:
    """The planner's answer (the output shown) beside the engine's measured steps at the same points."""
    import pandas as pd
    text = _output(root, EXAMPLES["plan-engine"])
    e = root / "traces" / "engine"
    cal = read_engine_csv(e / "h200" / "engine.csv")
    m = cal[(cal["phase"] == "mechanism") & (cal["design"] == DUALDECODER) & (cal["context"] == 131072)
            & (pd.to_numeric(cal["miss_rate"], errors="coerce") == FORCED_MISS) & (cal["transfers"] == 1)
            & (cal["status"] == "ok")]
    b = int(m["batch"].max())
    m = m[m["batch"] == b]
    dd_plan, sk_plan = (_num(_cell(text, d, "tokens/s")) for d in (DUALDECODER, SHADOWKV))
    sk_b = int(_num(_cell(text, SHADOWKV, "max batch")))
    out = [f"The engine's DualDecoder step at {FORCED_MISS * 100:.1f} % misses, batch {b} at 128K (`traces/engine/h200`, mechanism"
           f" phase, {len(m)} repetitions; {alias_note(m, read_trace_json(e / 'h200' / 'meta.json').get('host_gib'))}), runs at"
           f" {median(m['tok_s']):.1f} tokens/s ({m['tok_s'].min():.1f}-{m['tok_s'].max():.1f}): link-bound, the"
           f" ceiling that the planned {dd_plan:.1f} tokens/s sits below."]
    fast = [read_engine_csv(p) for p in sorted((e / "h200-shadowkv-fast" / "builds").glob("*/engine.csv"))]
    rates = read_engine_csv(e / "h200-rates" / "engine.csv")
    pts = []
    for src, d in [("h200-shadowkv-fast/builds", x) for x in fast] + [("h200-rates", rates)]:
        g = d[(d["design"] == SHADOWKV) & (d["context"] == 131072) & (d["batch"] == sk_b)
              & d["status"].astype(str).str.startswith("ok")]
        pts += [(float(r["miss_rate"]), float(r["tok_s"]), src) for _, r in g.iterrows()]
    if not pts:
        return " ".join(out) + f" The engine has not run ShadowKV at batch {sk_b} (128K)."
    by = {}
    for miss, tok, _ in pts:
        by.setdefault(miss, []).append(tok)
    meas = ", ".join(f"{median(v):,.0f} at {fmt_pct(k, 0)}" for k, v in sorted(by.items()))
    g = fast[0][(fast[0]["design"] == SHADOWKV) & (fast[0]["batch"] == sk_b) & (fast[0]["context"] == 131072)]
    rate, mean_b = _cell(text, SHADOWKV, "max rate req/s per decode GPU"), _cell(text, SHADOWKV, "mean batch")
    out.append(f"The planner's ShadowKV sustains {rate} req/s ({sk_plan:,.1f} tokens/s, mean batch {mean_b}, max"
               f" {sk_b}), bound by {_cell(text, SHADOWKV, 'binding')}: its tokens/s follows the batch. The engine"
               f" ran ShadowKV in place at 128K, batch {sk_b} (`traces/engine/h200-shadowkv-fast/builds`,"
               f" `h200-rates`; median tokens/s by forced miss rate over {len(pts)} builds): {meas};"
               f" {alias_note(g, read_trace_json(e / 'h200-shadowkv-fast' / 'builds' / 'b0' / 'meta.json').get('host_gib'))}."
               " The simulator's step at those points: [simulator.md](simulator.md),"
               " the in-place engine.")
    return " ".join(out)


def notes_validation(root: Path = ROOT) -> str:
    """The validation's headline sentence (traces/validation/h200-engine.csv, the points with transfers)."""
    from ddbench.doctables.common import read_trace_csv
    v = read_trace_csv(root / "traces" / "validation" / "h200-engine.csv")
    v = v.assign(err=(v["sim_over_engine"] - 1).abs())
    t = v[v["transfers"] == 1]
    lb = t[t["regime"] == "link-bound"]
    ctx = "/".join(fmt_context(int(c)) for c in sorted(t["context"].unique()))
    bs = "/".join(str(int(b)) for b in sorted(t["batch"].unique()))
    miss = sorted({float(m) for m in t["miss_rate"].astype(str) if m != "none"})
    miss = "/".join(f"{100 * m:g} %" for m in miss)
    gib = read_trace_json(root / "traces" / "engine" / "h200-validation" / "meta.json").get("host_gib")
    from ddbench.core.catalog import get_model
    from ddbench.core.designs import get_design
    from ddbench.core.memory import host_kv_bytes
    from ddbench.core.workload import Workload
    m, dd = get_model("llama-3-8b"), get_design(DUALDECODER)
    aliased = sorted({(int(c), int(b)) for c, b in zip(t["context"], t["batch"])
                      if gib and int(b) * host_kv_bytes(dd, m, Workload(context=int(c))) > gib * 2 ** 30})
    alias = ("" if not aliased else
             f" The engine ran them from one pinned {gib:g} GiB host buffer (`h200-validation/meta.json`"
             f" host_gib), smaller than the batch's KV at " + ", ".join(f"{fmt_context(c)} batch {b}" for c, b in aliased)
             + ": there the host KV is aliased (layers read l % host_layers, then overlapping request windows);"
             " every chunk still crosses the link, only the values repeat.")
    return (f"At the engine validation points with transfers ({ctx}, batches {bs}, {miss} forced misses; {len(t)} points of"
            f" {len(v)}) the sim is within {fmt_pct(float(t['err'].median()))} median, {fmt_pct(float(t['err'].max()))}"
            f" worst (link-bound median {fmt_pct(float(lb['err'].median()))}, {len(lb)} points)." + alias)


def inplace_validation(root: Path = ROOT) -> str:
    """The in-place engine's validations (traces/validation/h200-engine-inplace and -rates summaries):
    per run, points, builds, median |error| over points and the worst point; ShadowKV's points one by
    one; and how the engine's host KV held those batches."""
    v = root / "traces" / "validation"
    rows, lines = [], []
    for name, label in (("inplace", "ShadowKV in place"), ("rates", "h200-rates, other designs")):
        s = read_trace_json(v / f"h200-engine-{name}-summary.json")
        pp = s["per_point"]
        if not pp:
            continue
        w = max(pp, key=lambda p: abs(p["error_median"]))
        wb = max((w["error_min"], w["error_max"]), key=abs)
        what = f"{w['design']} {fmt_context(int(w['context']))} batch {int(w['batch'])}, {float(w['miss_rate']) * 100:g} % misses"
        if w.get("churn_rate") not in ("", None):
            what += f", churn {float(w['churn_rate']) * 100:g} %"
        rows.append([label, str(len(pp)), str(sum(int(p["builds"]) for p in pp)),
                     fmt_pct(median(abs(p["error_median"]) for p in pp)),
                     f"{100 * w['error_median']:+.1f} % ({100 * wb:+.1f} % worst build): {what}"])
        if name == "inplace":
            sk = [p for p in pp if p["model"] == "llama-3-8b"]
            lines.append("ShadowKV in place, Llama-3-8B, by point (median over builds): " + "; ".join(
                f"{fmt_context(int(p['context']))} batch {int(p['batch'])} at {float(p['miss_rate']) * 100:g} % misses"
                f" {100 * p['error_median']:+.1f} %" for p in sorted(sk, key=lambda p: (-p["batch"], p["context"],
                                                                                       float(p["miss_rate"])))) + ".")
    from ddbench.doctables.common import md_table
    e = root / "traces" / "engine" / "h200-shadowkv-fast" / "builds"
    b0 = read_engine_csv(e / "b0" / "engine.csv")
    big = b0[b0["batch"] > 1]
    rates = read_engine_csv(root / "traces" / "engine" / "h200-rates" / "engine.csv")
    lines.append("The engine's batches above 1: `h200-shadowkv-fast/builds`: "
                 + alias_note(big, read_trace_json(e / "b0" / "meta.json").get("host_gib"))
                 + "; `h200-rates` (no meta.json): " + alias_note(rates[rates["batch"] > 1], None) + ".")
    return (md_table(["run", "points", "builds", "median \\|error\\|", "worst point"], rows) + "\n\n"
            + "\n\n".join(lines))


GENERATORS = {f"example-{name}": (lambda root=ROOT, _n=name: example(_n, root)) for name in EXAMPLES}
GENERATORS.update({
    "notes-plan-host": notes_plan_host,
    "notes-plan-fleet": notes_plan_fleet,
    "notes-plan-search": notes_plan_search,
    "notes-plan-engine": notes_plan_engine,
    "notes-validation": notes_validation,
    "inplace-validation": inplace_validation,
})
