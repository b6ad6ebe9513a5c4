"""`ddbench sweep`: spec validation, the tidy table, resume, the --max-points guard, Ray."""

import json
import os
import textwrap

import pandas as pd
import pytest

from tests.cli import assert_one_line_error, ddbench

SPEC = """\
name: tiny
requests: 40
grid:
  model: llama-3-8b
  gpu: h200
  system: [shadowkv, dualdecoder]
  context: 32k
  output: "64"
  rate: [0.5, 4]
"""


def _spec(tmp_path, text=SPEC, name="spec.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def _lines(path):
    with open(path) as fh:
        return fh.read().splitlines()


def test_sweep_table_and_resume(tmp_path):
    spec = _spec(tmp_path)
    out = tmp_path / "out"
    r = ddbench("sweep", spec, "--out", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert "4 points (4 run, 0 reused" in r.stdout
    df = pd.read_parquet(out / "results.parquet")
    csv = pd.read_csv(out / "results.csv")
    assert len(df) == len(csv) == 4 and list(df.columns) == list(csv.columns)
    for col in ("rate_req_per_s", "tokens_per_s", "completion_p99_s", "tpot_p99_s", "peak_memory_gb",
                "budget_tokens", "link_gbps_per_gpu", "sustainable", "binding"):
        assert col in df.columns
    assert sorted(df.rate_req_per_s.unique()) == [0.5, 4.0] and set(df.system) == {"shadowkv", "dualdecoder"}
    assert (df.completed == 40).all() and (out / "summary.png").stat().st_size > 10_000
    # more load, longer completion: the table is the simulator's, not a constant
    for s in ("shadowkv", "dualdecoder"):
        d = df[df.system == s].set_index("rate_req_per_s")
        assert d.completion_p99_s[4.0] > d.completion_p99_s[0.5]
    # resume: a rerun redoes nothing; an interrupted store (two points and a torn line) runs the rest
    r2 = ddbench("sweep", spec, "--out", str(out), "--quiet")
    assert r2.returncode == 0 and "(0 run, 4 reused" in r2.stdout
    lines = _lines(out / "points.jsonl")
    assert len(lines) == 4
    (out / "points.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][:30])
    r3 = ddbench("sweep", spec, "--out", str(out), "--workers", "1")
    assert r3.returncode == 0 and "(2 run, 2 reused" in r3.stdout, r3.stdout + r3.stderr
    df3 = pd.read_parquet(out / "results.parquet")
    cols = [c for c in df.columns if c not in ("sim_wall_s", "sim_cpu_s", "worker_pid")]
    pd.testing.assert_frame_equal(df[cols], df3[cols])
    # a grown grid reuses the points it shares
    r4 = ddbench("sweep", _spec(tmp_path, SPEC.replace("[0.5, 4]", "[0.5, 2, 4]"), "spec2.yaml"),
                 "--out", str(out), "--quiet")
    assert r4.returncode == 0 and "6 points (2 run, 4 reused" in r4.stdout


@pytest.mark.parametrize("text, message", [
    (SPEC.replace("  rate:", "  colour: red\n  rate:"), "grid.colour: unknown field"),
    (SPEC + "workers: 3\n", "workers: unknown field"),
    (SPEC.replace("[0.5, 4]", "[0.5, -4]"), "grid.rate[1]: Input should be greater than or equal to"),
    (SPEC.replace("[0.5, 4]", "[0.5, .inf]"), "grid.rate[1]: must be finite, got inf"),
    (SPEC.replace("[0.5, 4]", "[0.5, 1e-308]"), "grid.rate[1]: Input should be greater than or equal to"),
    (SPEC.replace("  model: llama-3-8b", "  model: llama-3-8b\n  link: ''"), "grid.link[0]: String should have at least"),
    (SPEC.replace("  model: llama-3-8b", "  model: llama-3-8b\n  hit_rate: .nan"), "grid.hit_rate[0]"),
    (SPEC.replace("  model: llama-3-8b", "  model: llama-3-8b\n  hit_rate: 1.5"), "grid.hit_rate[0]: Input should be less than or equal to 1"),
    (SPEC.replace("  model: llama-3-8b", "  model: llama-3-8b\n  chunk: 0"), "grid.chunk[0]: Input should be greater"),
    (SPEC.replace("  model: llama-3-8b", "  model: llama-3-8b\n  seed: -1"), "grid.seed[0]: Input should be greater"),
    (SPEC.replace("  system: [shadowkv, dualdecoder]", "  system: [shadowkv]\n  design: [dualdecoder]"),
     "design: or as system:, not both"),
    (SPEC.replace("  system: [shadowkv, dualdecoder]", "  system: []"), "grid.system: List should have at least 1"),
    (SPEC.replace("name: tiny", "name: ../../x"), "name: '../../x' is not a plain name"),
    (SPEC.replace("name: tiny", "name: .hidden"), "is not a plain name"),
    (SPEC.replace("name: tiny", "name: a/b"), "is not a plain name"),
    (SPEC.replace("[0.5, 4]", "[0.5, fast]"), "grid.rate[1]: must be a number, not the text 'fast'"),
    (SPEC.replace("requests: 40", "requests: 0"), "requests: Input should be greater than or equal to 1"),
    (SPEC.replace("  model: llama-3-8b", "  gpu2: x"), "grid.model: Field required"),
    (SPEC.replace("model: llama-3-8b", "model: [llama-3-8b, gpt-9]"), "grid.model[1]: unknown model 'gpt-9'"),
    (SPEC.replace("[shadowkv, dualdecoder]", "[shadowkv, vllm]"), "grid.system[1]: unknown design 'vllm'"),
    (SPEC.replace("context: 32k", "context: 1k"), "sparse budget 2048 is larger than the context"),
    (SPEC.replace('output: "64"', "output: exp:many"), "grid.output[0]"),
    (SPEC.replace("  rate:", "  kv_bits: [8, 12]\n  rate:"), "grid.kv_bits[1]"),
    (SPEC.replace("  rate:", "  kv_bits: 8\n  rate:").replace("[shadowkv, dualdecoder]", "specache"),
     "fp8 KV (kv_bits 8) applies to designs that keep their KV on the host"),
    (SPEC.replace("  rate:", "  cache_tokens: lots\n  rate:"), "grid.cache_tokens[0]"),
    ("grid: [1, 2\n", "not valid YAML at line"),
    ("- just a list\n", "expected a mapping"),
    ("when: 2020-13-45\n", "not valid YAML"),
])
def test_sweep_spec_errors(tmp_path, text, message, capsys, monkeypatch):
    """In process (fast); the subprocess test below covers the same path end to end."""
    from ddbench.cli import main
    spec = _spec(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", spec]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and len(cap.err.strip().splitlines()) == 1 and message in cap.err, cap.err
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]   # nothing left behind


@pytest.mark.parametrize("text, message", [
    (SPEC.replace("  rate:", "  colour: red\n  rate:"), "grid.colour: unknown field"),
    ("grid: [1, 2\n", "not valid YAML at line"),
    (SPEC.replace("  rate:", "  cache: [pingpong]\n  rate:"),       # the buffer layout's old field name
     "grid.cache: the sparse-KV buffer layout (design | pingpong | per-layer) is now the field buffers"),
])
def test_sweep_spec_errors_subprocess(tmp_path, text, message):
    spec = _spec(tmp_path, text)
    r = ddbench("sweep", spec, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]   # nothing left behind


def test_binary_spec_is_one_line(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(bytes(range(256)) * 4)
    r = ddbench("sweep", str(spec), cwd=tmp_path)
    assert_one_line_error(r, contains="not a text file")
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]


@pytest.mark.parametrize("args, message", [(["--out", ""], "argument --out: '': is empty"),
                                           (["--workers", "0"], "argument --workers: '0': must be"),
                                           (["--max-points", "-1"], "argument --max-points"),
                                           (["--address", ""], "argument --address: '': is empty")])
def test_sweep_flags_are_checked(tmp_path, args, message, capsys, monkeypatch):
    from ddbench.cli import main
    spec = _spec(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["sweep", spec, *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]


def test_design_key_and_a_point_that_does_not_fit(tmp_path):
    """`design:` is the grid's designs too; a point whose weights exceed the GPU is a row with status
    does-not-fit (the other points run); the CSV reads plainly with pandas."""
    text = SPEC.replace("  model: llama-3-8b\n  gpu: h200", "  model: [llama-3-8b, llama-3-70b]\n  gpu: l40s")
    text = text.replace("system: [shadowkv, dualdecoder]", "design: dualdecoder").replace("[0.5, 4]", "[0.5]")
    out = tmp_path / "out"
    r = ddbench("sweep", _spec(tmp_path, text), "--out", str(out), "--workers", "1", "--quiet")
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "results.csv")
    assert list(df.columns[:3]) == ["key", "model", "gpu"] and "status" in df.columns and "system" in df.columns
    rows = df.set_index("model")
    assert rows.status["llama-3-8b"] == "ok" and rows.completed["llama-3-8b"] == 40
    assert rows.status["llama-3-70b"] == "does-not-fit" and rows.rejected["llama-3-70b"] == 40
    assert rows.binding["llama-3-70b"] == "memory" and rows.max_batch_fit["llama-3-70b"] == 0
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["command"] == "ddbench sweep" and prov["arguments"]["workers"] == 1


def test_sweep_where_no_point_fits_is_exit_3(tmp_path):
    text = SPEC.replace("  model: llama-3-8b\n  gpu: h200", "  model: llama-3-70b\n  gpu: l40s")
    r = ddbench("sweep", _spec(tmp_path, text.replace("[0.5, 4]", "[0.5]")), "--out", str(tmp_path / "o"), "--quiet")
    assert r.returncode == 3, r.stderr
    assert "not one point fits" in r.stdout and (tmp_path / "o" / "results.csv").exists()


def test_sweep_max_points_guard(tmp_path):
    spec = _spec(tmp_path)
    r = ddbench("sweep", spec, "--max-points", "3", cwd=tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "the grid has 4 points, above --max-points 3; pass --yes" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]
    r = ddbench("sweep", spec, "--max-points", "3", "--yes", "--quiet", cwd=tmp_path)
    assert r.returncode == 0 and "4 points (4 run" in r.stdout
    assert os.path.exists(tmp_path / "sweep-out" / "tiny" / "results.parquet")


def test_sweep_unreachable_ray_address(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'ddbench[ray]')")
    spec = _spec(tmp_path)
    r = ddbench("sweep", spec, "--executor", "ray", "--address", "127.0.0.1:1", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in r.stderr and "ray start --head" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["spec.yaml"]


@pytest.mark.slow      # a local Ray instance starts (about 8 s); make test-slow
def test_sweep_on_local_ray_equals_local_pool(tmp_path, capsys):
    """The Ray path on a local Ray instance this test starts and stops: same rows as the local pool,
    computed in Ray's worker processes."""
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'ddbench[ray]')")
    from ddbench.cli import main
    spec = _spec(tmp_path)
    assert main(["sweep", spec, "--out", str(tmp_path / "local"), "--workers", "1", "--quiet"]) == 0
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert main(["sweep", spec, "--out", str(tmp_path / "ray"), "--executor", "ray", "--quiet"]) == 0
        assert ray.is_initialized()  # an instance the caller started is left to the caller
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert "on ray" in out
    a = pd.read_parquet(tmp_path / "local" / "results.parquet")
    b = pd.read_parquet(tmp_path / "ray" / "results.parquet")
    cols = [c for c in a.columns if c not in ("sim_wall_s", "sim_cpu_s", "worker_pid")]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert os.getpid() not in set(b.worker_pid)
    assert json.loads((tmp_path / "ray" / "spec.json").read_text())["grid"]["rate"] == [0.5, 4.0]


def test_sweep_grid_kv_bits_and_cache_tokens():
    """kv_bits and cache_tokens are grid axes; left null, a point's key is what it was before them."""
    from ddbench.planner.spec import point_key, points, scenario_of
    g = dict(model=["llama-3-8b"], gpu=["h200"], link=[None], host=[None], fetching=[None], host_mem_gb=[None],
             system=["dualdecoder-cache"], context=["128k"], output=["64"], budget=[2048], chunk=[8],
             lowrank_layers=[0], buffers=["design"], cache_tokens=[None, "8k"], kv_bits=[None, 8], cache_bits=[None],
             hit_rate=[None], prefill=["here"], rate=[1.0], seed=[0], index=[None])
    ps = points(dict(requests=10, max_batch=None, grid=g))
    assert len(ps) == 4
    sc = {(p["cache_tokens"], p["kv_bits"]): scenario_of(p) for p in ps}
    assert sc[("8k", 8)].knob("kv_bits") == 8 and sc[("8k", 8)].knob("cache_tokens") == 8192
    assert sc[(None, None)].knob("kv_bits") == 16
    plain = [p for p in ps if p["cache_tokens"] is None and p["kv_bits"] is None][0]
    old = {k: v for k, v in plain.items() if k not in ("cache_tokens", "kv_bits")}
    assert point_key(plain) == point_key(old)


def test_sweep_buffers_axis_and_a_store_from_before_the_rename(tmp_path, capsys, monkeypatch):
    """The buffer layout's axis is `buffers` (once `cache`): a point's key hashes it under the old name,
    so a points.jsonl written before the rename resumes, its rows under today's column."""
    import hashlib
    from ddbench.cli import main
    from ddbench.planner.spec import point_key
    old = json.dumps({"cache": "pingpong", "rate": 1.0, "system": "dualdecoder"}, sort_keys=True)
    assert point_key({"system": "dualdecoder", "buffers": "pingpong", "rate": 1.0}) == \
        hashlib.sha1(old.encode()).hexdigest()[:16]
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path, SPEC.replace("  rate:", "  buffers: [pingpong, per-layer]\n  rate:"))
    assert main(["sweep", spec, "--out", "out", "--workers", "1", "--quiet"]) == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    assert "cache" not in df.columns and len(df) == 8
    dd = df[df.system == "dualdecoder"].set_index(["buffers", "rate_req_per_s"]).peak_sparse_kv_buffers_gb
    assert (dd["per-layer"] > dd["pingpong"]).all()
    store = tmp_path / "out" / "points.jsonl"
    rows = [json.loads(x) for x in _lines(store)]
    store.write_text("".join(json.dumps({("cache" if k == "buffers" else k): v for k, v in r.items()}) + "\n"
                             for r in rows))
    capsys.readouterr()
    assert main(["sweep", spec, "--out", "out", "--quiet", "--force"]) == 0
    assert "(0 run, 8 reused" in capsys.readouterr().out
    again = pd.read_csv(tmp_path / "out" / "results.csv")
    cols = [c for c in df.columns if c not in ("sim_wall_s", "sim_cpu_s", "worker_pid")]
    pd.testing.assert_frame_equal(df[cols], again[cols])
