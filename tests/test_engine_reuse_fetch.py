"""The reuse-fetch record (kernels/engine/sweep.py phase `reuse-fetch`) and its import into a calibration
bundle (ddbench/core/calibration.py): phase selection, the point plan, the sweep's files (engine.csv keeps
step points only), the bundle's reuse_fetch section with and without the records (CPU); the engine's
factored reuse fetch against its torch twin and one measured point (GPU)."""

import csv
import json
import os
import shutil

import pytest
import torch

from ddbench.core.errors import DDBenchError
from ddbench.core.paths import traces_dir

sweep = pytest.importorskip("ddbench.kernels.engine.sweep")
from ddbench.kernels.engine import phases, points, results  # noqa: E402

PROV = {"gpu": "NVIDIA H200", "git_sha": "abc", "date_utc": "2026-12-01T00:00:00Z", "command": "pytest"}


# ------------------------------------------------------------------ phases and points

def test_phase_selection_and_point_plan():
    assert sweep.PHASES[-1] == "reuse-fetch"                     # after the existing phases
    assert sweep.parse_phases("reuse-fetch") == ("reuse-fetch",)
    assert sweep.parse_phases("reuse-fetch,floor") == ("floor", "reuse-fetch")
    assert sweep.out_folder("h200", ("reuse-fetch",)) == "h200-reuse-fetch"
    assert sweep.out_folder("h200", sweep.PHASES) == "h200"
    pts = sweep.plan_points(False, 3, ("reuse-fetch",))
    assert pts == phases.reuse_points() and len(pts) == 24
    assert {p[0] for p in pts} == {"reuse-fetch"} and {p[2] for p in pts} == {"shadowkv"}
    want = {(32768, b, m) for b in (1, 2, 4, 8, 16, 32, 64) for m in (0.0, 0.25, 1.0)}
    want |= {(131072, 16, m) for m in (0.0, 0.25, 1.0)}
    assert {(p[3], p[4], p[5]) for p in pts} == want
    assert all(p[6] is True and p[7] is True and p[1] == 0 for p in pts)
    allp = sweep.plan_points(False, 3)                            # the default run includes it, last
    assert allp[-len(pts):] == pts and len({json.dumps(p) for p in allp}) == len(allp)
    for ph in ("floor", "mechanism", "validation"):
        assert not any(p[0] == "reuse-fetch" for p in sweep.plan_points(False, 3, (ph,)))
    for p in pts:                                                 # resume keys: 8 fields, as the others
        assert len(json.loads(json.dumps(list(p)))) == 8


def test_cli_bad_phase_is_one_line(capsys):
    assert sweep.main(["--phases", "reuse_fetch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reuse-fetch" in err and "Traceback" not in err


# ------------------------------------------------------------------ sweep files and the bundle import

def _reuse_row(batch, miss, status="ok", ctx=32768):
    r = dict(phase="reuse-fetch", rep=0, design="shadowkv", context=ctx, batch=batch, miss_rate=miss, transfers=1,
             graph=1, status=status)
    if status == "ok":
        slots = batch * 8 * 256
        mc = batch * 8 * round(miss * 256)
        r.update(layers=32, host_layers=2, slots=slots, miss_chunks=mc, chunk_bytes=2048, programs=32, items=2,
                 rounds=-(-slots // 64), link_mib=mc * 2048 / 2**20, copy_ms=0.01 * batch, plan_ms=0.02,
                 gather_ms=0.05 * batch, fetch_ms=0.06 * batch, fetch_ms_min=0.059 * batch,
                 fetch_ms_max=0.061 * batch, replays=5, buffer_tokens=2600, peak_gib=1.0, wall_s=0.5)
    return r


def _floor_row(batch):
    return dict(phase="floor", rep=0, design="shadowkv", context=32768, batch=batch, miss_rate="none", transfers=0,
                graph=1, status="ok", step_ms=10.0 + batch, floor_ms=5.0, step_over_floor=2.0, urgent_programs=64,
                prefetch_mib=0.0, urgent_mib=0.0, link_mib=0.0, link_gbps=0.0)


def _sweep(tmp_path, name, reuse=True):
    d = tmp_path / name
    rows = [_floor_row(1), _floor_row(16)]
    if reuse:
        rows += [_reuse_row(1, 0.0), _reuse_row(1, 0.25), _reuse_row(64, 1.0, status="oom"),
                 _reuse_row(16, 1.0, ctx=131072)]
    meta = dict(provenance=PROV, run_id=name, phases=list(sweep.PHASES), seed=0)
    results.write(str(d), rows, dict(meta))
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def test_write_keeps_reuse_rows_out_of_engine_csv(tmp_path):
    d = _sweep(tmp_path, "s")
    with open(d / "engine.csv", newline="") as fh:
        eng = list(csv.DictReader(fh))
    assert [r["phase"] for r in eng] == ["floor", "floor"]
    with open(d / "reuse_fetch.csv", newline="") as fh:
        rf = list(csv.DictReader(fh))
    assert [r["status"] for r in rf] == ["ok", "ok", "oom", "ok"]
    assert float(rf[1]["fetch_ms"]) == pytest.approx(0.06) and rf[1]["miss_chunks"] == str(8 * 64)
    summary = json.loads((d / "summary.json").read_text())
    assert len(summary["reuse_fetch"]) == 4 and "shadowkv|32768|1" in summary["ratios"]["step_over_floor"]
    from ddbench.kernels.engine.tables import render
    assert "shadowkv" in render(str(d))                            # the README tables still render
    # a sweep without the phase writes no reuse_fetch.csv
    d2 = _sweep(tmp_path, "s2", reuse=False)
    assert not (d2 / "reuse_fetch.csv").exists() and "reuse_fetch" not in json.loads((d2 / "summary.json").read_text())


def _bundle(tmp_path):
    b = tmp_path / "bundle"
    shutil.copytree(str(traces_dir("calibration", "h200")), str(b))
    return str(b)


def test_import_with_and_without_reuse_fetch_records(tmp_path):
    from ddbench.core.calibration import import_engine_sweep, load_bundle
    b = _bundle(tmp_path)
    n = import_engine_sweep(b, str(_sweep(tmp_path, "with")), "pytest", "2026-12-01")
    bun = load_bundle(b)
    assert n == len(bun.rows["engine"]) == 2
    rf = bun.rows["reuse_fetch"]
    assert len(rf) == 3                                           # the oom row is left out
    r = {(x["context"], x["batch"], x["miss_rate"]): x for x in rf}[(32768, 1, 0.25)]
    assert r["system"] == "shadowkv" and r["model"] == "llama-3-8b"
    assert r["fetch_ms"] == pytest.approx(0.06) and r["gather_ms"] == pytest.approx(0.05)
    assert r["copy_ms"] == pytest.approx(0.01) and r["plan_ms"] == pytest.approx(0.02)
    assert (r["slots"], r["chunk_bytes"], r["programs"], r["items"]) == (2048, 2048, 32, 2)
    assert r["miss_chunks"] == 512 and r["link_bytes"] == 512 * 2048
    assert {x["miss_rate"] for x in rf if x["batch"] == 1} == {0.0, 0.25}
    sec = bun.meta["sections"]["reuse_fetch"]
    assert sec["complete"] and sec["rows"] == 3 and sec["source"]["run_id"] == "with"
    # an older sweep (no reuse_fetch.csv) still imports, and the other sweep's records go
    import_engine_sweep(b, str(_sweep(tmp_path, "without", reuse=False)), "pytest", "2026-12-02")
    bun = load_bundle(b)
    assert len(bun.rows["engine"]) == 2 and bun.rows["reuse_fetch"] == []
    assert "reuse_fetch" not in bun.meta["sections"] and not os.path.exists(os.path.join(b, "reuse_fetch.csv"))
    assert bun.meta["sections"]["engine"]["source"]["run_id"] == "without"


def test_committed_bundle_holds_the_committed_sweeps_records():
    """The committed bundle's reuse_fetch section is the committed sweep's reuse_fetch.csv, row for row."""
    from ddbench.core.calibration import load_bundle
    rows = load_bundle(str(traces_dir("calibration", "h200"))).rows["reuse_fetch"]
    with open(os.path.join(str(traces_dir("engine", "h200")), "reuse_fetch.csv")) as f:
        sweep = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    key = lambda r: (int(r["context"]), int(r["batch"]), float(r["miss_rate"]))   # noqa: E731
    assert len(rows) == len(sweep) == 24
    for a, b in zip(sorted(rows, key=key), sorted(sweep, key=key)):
        assert key(a) == key(b) and a["fetch_ms"] == pytest.approx(float(b["fetch_ms"]), rel=1e-9)
        assert a["link_bytes"] == float(b["miss_chunks"]) * float(b["chunk_bytes"])


def test_bad_reuse_row_is_one_line(tmp_path):
    from ddbench.core.calibration import import_engine_sweep
    b = _bundle(tmp_path)
    d = _sweep(tmp_path, "bad")
    text = (d / "reuse_fetch.csv").read_text().splitlines()
    cols = text[0].split(",")
    cells = text[1].split(",")
    cells[cols.index("fetch_ms")] = "x"
    (d / "reuse_fetch.csv").write_text("\n".join([text[0], ",".join(cells)] + text[2:]) + "\n")
    with pytest.raises(DDBenchError, match=r"reuse_fetch.csv, line 2") as exc:
        import_engine_sweep(b, str(d), "pytest", "2026-12-01")
    assert "\n" not in str(exc.value)


# ------------------------------------------------------------------ the engine's factored fetch

def _fetch_case(dev, B=2, H=3, N=40, k=8, C=4, d=8, S=40, miss=0.25):
    from ddbench.kernels.engine.transfer import perturb
    g = torch.Generator(device=dev).manual_seed(5)
    host = torch.randn(2, B, H, N, 2, C, d, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    if dev == "cuda":
        host = host.pin_memory()
    prev = torch.rand(B, H, N, device=dev, generator=g).topk(k, -1).indices.sort(-1).values.to(torch.int32)
    true = perturb(prev, miss, N, g)
    vb = torch.randn(B, H, S, d, device=dev, generator=g).to(torch.bfloat16)
    # the layer's buffer holds the previous selection's values in its first k*C tokens
    hv = host[1].to(dev)
    for b in range(B):
        for h in range(H):
            vb[b, h, :k * C] = hv[b, h, prev[b, h].long(), 1].reshape(k * C, d)
    spare = torch.zeros(B, H, S, d, device=dev, dtype=torch.bfloat16)
    return host, prev, true, vb, spare, hv


def test_reuse_fetch_assembles_the_true_selection_cpu():
    from ddbench.kernels.engine.engine import reuse_fetch, reuse_launch
    from ddbench.kernels.gather import gather_ref, gather_uva
    assert reuse_launch(gather_uva) == {"programs": 32, "items": 2}
    host, prev, true, vb, spare, hv = _fetch_case("cpu")
    B, H, k, (C, d) = *true.shape, host.shape[-2:]
    vb[:, :, k * C:] = 3.0
    reuse_fetch(gather_ref, host, 1, true, prev, None, vb, None, spare[:, :, :k * C])
    for b in range(B):
        for h in range(H):
            assert torch.equal(vb[b, h, :k * C], hv[b, h, true[b, h].long(), 1].reshape(k * C, d))
    assert (vb[:, :, k * C:] == 3.0).all()                         # the resident rows are not touched


@pytest.mark.gpu
def test_reuse_fetch_triton_matches_twin_gpu():
    from ddbench.kernels.engine.engine import reuse_fetch
    from ddbench.kernels.gather import gather_ref, gather_uva
    outs = []
    for fn in (gather_uva, gather_ref):
        host, prev, true, vb, spare, hv = _fetch_case("cuda")
        k, C = true.shape[-1], host.shape[-2]
        src = reuse_fetch(fn, host, 1, true, prev, None, vb, None, spare[:, :, :k * C])
        outs.append((vb, src))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0])
    assert int((outs[0][1] < 0).sum()) == true.shape[0] * true.shape[1] * round(0.25 * true.shape[2])


@pytest.mark.gpu
def test_reuse_fetch_point_gpu():
    from ddbench.core.catalog import get_model
    model = get_model("llama-3-8b")
    flat = torch.empty(1 << 29, dtype=torch.bfloat16, pin_memory=True)     # 1 GiB: 8 host layers at batch 1
    r = points.reuse_fetch_point(model, flat, 32768, 1, 0.25, reps=3, log=lambda t: None)
    assert r["status"] == "ok" and r["host_layers"] >= 1
    k = 2048 // 8
    assert r["slots"] == 8 * k and r["miss_chunks"] == 8 * round(0.25 * k)
    assert r["chunk_bytes"] == 8 * 128 * 2 and (r["programs"], r["items"]) == (32, 2)
    assert r["link_mib"] == pytest.approx(r["miss_chunks"] * r["chunk_bytes"] / 2**20)
    for c in ("copy_ms", "plan_ms", "gather_ms", "fetch_ms"):
        assert 0 < r[c] < 5
    assert r["fetch_ms"] > r["copy_ms"]


def test_import_reuse_records_from_a_separate_run(tmp_path):
    from ddbench.core.calibration import import_engine_sweep, load_bundle
    b = _bundle(tmp_path)
    floor = _sweep(tmp_path, "floor-only", reuse=False)
    rf = _sweep(tmp_path, "reuse-only")
    import_engine_sweep(b, str(floor), "pytest", "2026-12-01", reuse_dir=str(rf))
    bun = load_bundle(b)
    assert len(bun.rows["reuse_fetch"]) == 3
    assert bun.meta["sections"]["reuse_fetch"]["source"]["run_id"] == "reuse-only"
    assert bun.meta["sections"]["engine"]["source"]["run_id"] == "floor-only"


def test_point_memory_turns_out_of_memory_into_a_status(monkeypatch):
    """Both measuring functions share points.point_memory: an out-of-memory error (or a capture's
    RuntimeError saying so) marks the row 'oom' and the sweep goes on; any other error propagates."""
    for name in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda: None)
    row = dict(status="ok")
    with points.point_memory(row):
        raise RuntimeError("CUDA error: out of memory while capturing")
    assert row["status"] == "oom"
    row = dict(status="ok")
    with points.point_memory(row):
        raise torch.cuda.OutOfMemoryError("no room")
    assert row["status"] == "oom"
    with pytest.raises(RuntimeError, match="illegal"):
        with points.point_memory(dict(status="ok")):
            raise RuntimeError("illegal memory access")
