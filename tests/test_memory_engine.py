"""One memory model: the engine's allocation plan is ddbench.core.memory's categories, and at every committed
engine point (traces/engine/**/engine.csv) the memory the engine recorded by category is what the model
gives for that point, up to what older engines are recorded (their folder's meta.json) to have kept
otherwise."""

import csv
import json
from pathlib import Path

import pytest

from ddbench.core import memory
from ddbench.core.catalog.gpus import get_gpu
from ddbench.core.catalog.models import get_model
from ddbench.core.designs import DESIGNS
from ddbench.core.memory import Workload

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "traces" / "engine"
KEPT = ("resident_kv", "landmarks", "aux_residency", "sparse_kv_buffers")
GIB = 2 ** 30


def _workload(r: dict) -> Workload:
    spec = DESIGNS[r["design"]]
    kw = {k: int(float(r[k])) for k in ("kv_bits", "cache_bits") if r.get(k) not in (None, "", "nan")}
    if spec.chunk_cache and r.get("cache_tokens") not in (None, "", "nan"):
        kw["cache_tokens"] = int(float(r["cache_tokens"]))
    return Workload(context=int(r["context"]), batch=int(r["batch"]), **kw)


def _older(csv_path: Path) -> dict:
    """The folder's recorded allocation of older engines (its meta.json, or provenance.json where the run's
    meta.json was not kept): {source_hash: {design: {category: bytes/request}}}."""
    for folder in (csv_path.parent, csv_path.parent.parent):
        for name in ("meta.json", "provenance.json"):
            if (folder / name).is_file() and folder != ENGINE:
                return json.loads((folder / name).read_text()).get("allocation_vs_current_engine", {})
    return {}


def _rows():
    out = []
    for path in sorted(ENGINE.glob("**/engine.csv")):
        older = _older(path)
        for r in csv.DictReader(path.open()):
            if r.get("mem_landmarks_gib") not in (None, ""):
                out.append((path, older, r))
    return out


ROWS = _rows()


def test_every_committed_engine_point_is_the_memory_model():
    """Each row's mem_<category>_gib (the engine's allocation at that point, recorded by the run) equals the
    model's bytes for the row's design, model, context, batch, cache and bits, transfers as run, SpeCache's
    values held (the runs' quant_values); rows of an older engine differ by exactly what their meta.json says."""
    assert len(ROWS) > 1400 and len({p.parent for p, _, _ in ROWS}) >= 15
    older_rows = 0
    for path, older, r in ROWS:
        spec, m, w = DESIGNS[r["design"]], get_model(r["model"]), _workload(r)
        transfers = r.get("transfers", "1") not in ("0", "False", "0.0")
        model = {"resident_kv": memory.resident_kv_bytes(spec, m, w),
                 "landmarks": memory.landmark_bytes(spec, m, w),
                 "aux_residency": memory.aux_residency_bytes(spec, m, w),
                 "sparse_kv_buffers": memory.sparse_buffer_bytes(spec, m, w, transfers=transfers)}
        delta = older.get(r.get("source_hash"), {}).get(r["design"], {})
        older_rows += bool(delta)
        for c in KEPT:
            want = model[c] + delta.get(c, 0) * w.batch
            assert float(r[f"mem_{c}_gib"]) * GIB == pytest.approx(want, rel=1e-9, abs=1e-3), \
                (str(path.relative_to(ROOT)), r["design"], r["batch"], c)
    assert 300 < older_rows < 400          # ShadowKV before its in-place fetch, the chunk cache before its fused fill


def test_the_engine_plan_is_the_memory_model():
    """plan_bytes (what the engine refuses a point by) is the model's categories, whatever the engine's own
    switches: at the paper's float32 CPU twin and bf16, with and without transfers and SpeCache's values."""
    pytest.importorskip("torch")
    from ddbench.kernels.engine.engineconfig import PLAN_CATEGORIES, EngineConfig, plan_bytes
    assert PLAN_CATEGORIES == KEPT
    m = get_model("llama-3-8b")
    for spec in DESIGNS.values():
        for transfers in (True, False):
            for qv in (True, False):
                cfg = EngineConfig.of(context=32768, batch=3, transfers=transfers, quant_values=qv, cache_tokens=4096)
                plan = plan_bytes(m, spec, cfg)
                b = memory.memory_breakdown(spec, m, get_gpu("h200"), cfg.workload)
                if transfers and qv:
                    assert plan == {c: getattr(b, c) for c in KEPT}, spec.name
                assert plan["sparse_kv_buffers"] == memory.sparse_buffer_bytes(spec, m, cfg.workload, transfers)


def test_dualdecoder_cache_at_128k_fits_the_batch_the_engine_ran():
    """The headline point: the engine ran dualdecoder-cache at batch 60 (Llama-3-8B, 128K, an 8192-token cache,
    the whole H200) with 138.7 GiB reserved at its peak; the model's largest batch is that 60 (it was 59 while
    the model counted an int64 chunk index beside every landmark that the engine does not keep, 2 MiB a
    request, and fewer buffer bytes than the engine holds)."""
    ran = [r for p, _, r in ROWS if p.parent.name == "h200-compare" and r["design"] == "dualdecoder-cache"
           and r["context"] == "131072" and r["model"] == "llama-3-8b" and r.get("kv_bits") == "16"
           and r["status"].startswith("ok")]
    largest = max(int(r["batch"]) for r in ran)
    assert largest == 60
    peak = max(float(r["peak_reserved_gib"]) for r in ran if int(r["batch"]) == largest)
    h200, m, dc = get_gpu("h200"), get_model("llama-3-8b"), DESIGNS["dualdecoder-cache"]
    assert peak * GIB + h200.runtime_overhead_bytes < h200.hbm_bytes          # it did fit
    w = Workload(context=131072, batch=60, cache_tokens=8192)
    assert memory.max_batch(dc, m, h200, w) == 60
    b61 = memory.memory_breakdown(dc, m, h200, Workload(context=131072, batch=61, cache_tokens=8192))
    assert not b61.fits


def test_the_model_fits_every_batch_the_engine_ran_on_a_whole_h200():
    """Every row that ran on an uncapped H200 is a batch the model says fits once the chunked prefill that
    serving holds beside the step (and a decode-only run does not) is set apart; with it, the model's largest
    batch is at most one below the largest the engine ran (Qwen2.5-7B at 128K: 137 of 138, its prefill chunk
    1.0 GiB) and at most one above (the engine's plan adds its measured workspace)."""
    h200 = get_gpu("h200")
    checked = 0
    for _, _, r in ROWS:
        if not r["status"].startswith("ok") or r.get("gpu_mem_cap") != "none":
            continue
        spec, m, w = DESIGNS[r["design"]], get_model(r["model"]), _workload(r)
        b = memory.memory_breakdown(spec, m, h200, w)
        assert b.total - memory.prefill_activation_bytes(spec, m, w) <= b.capacity, (r["design"], r["model"], r["batch"])
        if r.get("paper_role") == "largest" and r.get("largest_basis") == "planned":
            assert memory.max_batch(spec, m, h200, w) - int(r["batch"]) in (-1, 0, 1), (r["design"], r["context"])
        checked += 1
    assert checked > 500
