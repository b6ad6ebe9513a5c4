"""Issue 43: every file a user writes checked by one strict schema, paths beside the file that names them,
names unique per run, outputs that a full disk, a hang-up or a full stdout leave clean, resumed sweep
points checked, missing extras named at the start. Each case: its one line and exit code (or the right
result), and nothing left behind. In process where the case allows (fast), else a subprocess."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from tests.cli import ROOT, assert_one_line_error, command, ddbench, default_signals, env

GPU = "name: my-gpu\nhbm_bytes: 85520809984\nhbm_gbps: 3350\nbf16_tflops: 989\ndefault_link: pcie5\n"
SIM = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "8k", "--requests", "5", "--rate", "1",
       "--quiet"]


def _main(argv, capsys):
    from ddbench.cli import main
    try:
        rc = main(list(argv))
    except SystemExit as exc:          # a usage error: argparse exits 2
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_line(argv, capsys, *contains, code=2):
    rc, out, err = _main(argv, capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code and len(lines) == 1 and "Traceback" not in err, (rc, err)
    for c in contains:
        assert c in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _left(folder, *inputs):
    """Nothing but the inputs is left in `folder`."""
    assert sorted(os.listdir(folder)) == sorted(inputs)


# ---------------------------------------------------------------- hardware files: strict types and ranges

@pytest.mark.parametrize("name, text, says", [
    ("link.yaml", 'name: l\nnominal_gbps: "-50"\nachievable_gbps: "-60"\nmeasured: false\nbidir_total_gbps: 90\n',
     ("nominal_gbps: must be a number, not the text '-50'", "achievable_gbps: must be a number, not the text '-60'")),
    ("link.json", '{"name": "l", "nominal_gbps": "inf", "achievable_gbps": "nan", "measured": "false",'
                  ' "bidir_total_gbps": 0}',
     ("nominal_gbps: must be a number, not the text 'inf'", "achievable_gbps:", "measured: must be true or false",
      "bidir_total_gbps: must be above 0")),
    ("link.yaml", "name: l\nnominal_gbps: 50\nachievable_gbps: .inf\nmeasured: true\nbidir_total_gbps: 1e400\n",
     ("achievable_gbps: must be finite", "bidir_total_gbps: must be finite")),
])
def test_a_link_file_is_strict(here, capsys, name, text, says):
    (here / name).write_text(text)
    _one_line(SIM + ["--link", name, "--out", "o"], capsys, f"link file {name}:", *says)
    _left(here, name)


def test_a_gpu_file_bounds_its_integers_before_any_arithmetic(here, capsys):
    (here / "g.yaml").write_text(GPU.replace("85520809984", "9" * 400).replace("989", '"0"')
                                 + "fp8: 'false'\nruntime_overhead_bytes: 1.5\n")
    _one_line(["plan", "--model", "llama-3-8b", "--gpu", "g.yaml", "--context", "8k"], capsys, "GPU file g.yaml:",
              "hbm_bytes: must be", "bf16_tflops: must be a number, not the text '0'",
              "runtime_overhead_bytes: must be a whole number, got 1.5", "fp8: must be true or false")
    _left(here, "g.yaml")


def test_a_host_file_keeps_gpus_per_switch_within_gpus(here, capsys):
    (here / "h.yaml").write_text("name: h\ngpu: h200\ngpus: 2\ngpus_per_switch: 4\nlink: pcie5\nhost_mem_gbps: 300\n")
    _one_line(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "8k", "--host", "h.yaml"], capsys,
              "host file h.yaml: gpus_per_switch: must be at most gpus (2), got 4")
    (here / "h.yaml").write_text("name: h\ngpu: h200\ngpus: '8'\ngpus_per_switch: 2\nlink: pcie5\n"
                                 "host_mem_gbps: 300\n")
    _one_line(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "8k", "--host", "h.yaml"], capsys,
              "gpus: must be a whole number, not the text '8'")


def test_yaml_reads_an_exponent_as_a_number_and_a_quoted_one_as_text(here, capsys):
    (here / "g.yaml").write_text(GPU.replace("85520809984", "8e10"))
    rc, out, err = _main(["plan", "--model", "llama-3-8b", "--gpu", "g.yaml", "--context", "8k", "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["gpu"] == "my-gpu"


# ---------------------------------------------------------------- config.json

def _hf(**kw):
    cfg = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 8, "vocab_size": 128256, "rope_theta": 500000.0}
    cfg.update(kw)
    return json.dumps(cfg)


@pytest.mark.parametrize("text, says", [
    (_hf().replace('"num_hidden_layers": 32', '"num_hidden_layers": 1' + "0" * 30), "num_hidden_layers: must be at most"),
    (_hf(num_hidden_layers=1e30), "num_hidden_layers: must be at most"),
    (_hf(hidden_size="4096", tie_word_embeddings="false"),
     "hidden_size: must be a whole number, not the text '4096'"),
    (_hf(tie_word_embeddings="false"), "tie_word_embeddings: must be true or false, got 'false'"),
    ('{"a": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),
    ('{"a": ' + "[" * 40 + "]" * 40 + "}", "nested too deeply"),
])
def test_a_config_json_is_strict(here, capsys, text, says):
    (here / "config.json").write_text(text)
    _one_line(SIM[:2] + ["config.json"] + SIM[3:] + ["--out", "o"], capsys, "config.json", says)
    _left(here, "config.json")


def test_tie_word_embeddings_as_a_boolean_counts(here, capsys):
    from ddbench.core.catalog import model_from_hf_config
    (here / "config.json").write_text(_hf(tie_word_embeddings=False))
    untied = model_from_hf_config("config.json").weight_bytes
    (here / "config.json").write_text(_hf(tie_word_embeddings=True))
    assert model_from_hf_config("config.json").weight_bytes == untied - 128256 * 4096 * 2


# ---------------------------------------------------------------- sweep specs

SPEC = "requests: 5\ngrid:\n  model: llama-3-8b\n  gpu: h200\n  design: dualdecoder\n  context: 8k\n  rate: 1\n"


@pytest.mark.parametrize("text, says", [
    (SPEC.replace("requests: 5", 'requests: "5"'), "requests: must be a whole number, not the text '5'"),
    (SPEC.replace("rate: 1", "rate: ['1', .nan]"), "grid.rate[0]: must be a number, not the text '1'"),
    (SPEC.replace("rate: 1", "rate: 1\n  seed: 1e30"), "grid.seed[0]: Input should be less than or equal to"),
    ("grid: " + "[" * 100000 + "]" * 100000 + "\n", "nested too deeply"),
    ("grid: " + "[" * 40 + "]" * 40 + "\n", "nested too deeply"),
])
def test_a_sweep_spec_is_strict(here, capsys, text, says):
    (here / "s.yaml").write_text(text)
    _one_line(["sweep", "s.yaml", "--out", "o"], capsys, "sweep spec s.yaml", says)
    _left(here, "s.yaml")


# ---------------------------------------------------------------- paths beside the file that names them

def test_a_sweep_specs_hit_rate_file_is_found_beside_it(here, capsys):
    os.makedirs("specs")
    (here / "specs" / "acc.csv").write_text("layer,hit_rate\n" + "".join(f"{i},0.5\n" for i in range(32)))
    (here / "specs" / "s.yaml").write_text(SPEC.replace("rate: 1", "rate: 1\n  hit_rate: acc.csv"))
    rc, out, err = _main(["sweep", "specs/s.yaml", "--out", "sw", "--workers", "1", "--quiet"], capsys)
    assert rc == 0, err
    assert os.path.join(here, "specs", "acc.csv") in (here / "sw" / "results.csv").read_text()


def test_plan_config_files_are_found_beside_the_config_not_here(here, capsys):
    os.makedirs("c")
    (here / "g.yaml").write_text(GPU.replace("my-gpu", "gpu-here").replace("85520809984", "42949672960"))
    (here / "c" / "g.yaml").write_text(GPU.replace("my-gpu", "gpu-beside"))
    (here / "c" / "cfg.yaml").write_text("model: llama-3-8b\ngpu: g.yaml\ncontext: 8k\njson: true\n")
    rc, out, err = _main(["plan", "--config", "c/cfg.yaml"], capsys)
    assert rc == 0, err
    assert json.loads(out)["gpu"] == "gpu-beside"


# ---------------------------------------------------------------- names unique per run

def test_two_gpu_files_of_one_name_are_an_error(here, capsys):
    (here / "a.yaml").write_text(GPU)
    (here / "b.yaml").write_text(GPU.replace("3350", "335"))
    (here / "host.yaml").write_text("name: my-host\ngpu: b.yaml\ngpus: 8\ngpus_per_switch: 2\nlink: pcie5\n"
                                    "host_mem_gbps: 600\nhost_mem_gb: 2000\n")
    _one_line(["plan", "--model", "llama-3-8b", "--gpu", "a.yaml", "--host", "host.yaml", "--context", "8k"],
              capsys, "name 'my-gpu' is also the name of GPU file", "hbm_gbps differ")
    (here / "b.yaml").write_text(GPU)            # the same contents under one name: one GPU
    rc, _, err = _main(["plan", "--model", "llama-3-8b", "--gpu", "a.yaml", "--host", "host.yaml", "--context",
                        "8k"], capsys)
    assert rc == 0, err


# ---------------------------------------------------------------- outputs

def _limited(limit: int):
    def pre():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


@pytest.mark.parametrize("limit", [0, 100])
def test_a_full_disk_leaves_nothing_and_blocks_no_later_run(tmp_path, limit):
    """RLIMIT_FSIZE makes every write past `limit` bytes fail (EFBIG), as a full disk does (ENOSPC)."""
    r = subprocess.run(command(*SIM, "--out", "o"), cwd=tmp_path, env=env(), capture_output=True, text=True,
                       preexec_fn=_limited(limit), timeout=120)
    assert_one_line_error(r, contains="File too large")
    _left(tmp_path)
    os.makedirs(tmp_path / "o" / ".ddbench-stage-left")      # an earlier run's empty leftover
    r = ddbench(*SIM, "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not [f for f in os.listdir(tmp_path / "o") if f.startswith(".ddbench-stage")]


def test_a_killed_runs_half_written_manifest_blocks_no_later_run(here, capsys):
    rc, _, err = _main(SIM + ["--out", "o"], capsys)
    assert rc == 0, err
    (here / "o" / ".tmp-manifest-k1").write_bytes(b'{\n "schema": 1,\n "writ')             # before issue 43
    (here / "o" / ".ddbench-stage-manifest-k2").write_bytes(b'{\n "schema": 1,\n "written_by": "ddbench", "fi')
    (here / "o" / ".ddbench-stage-k3").mkdir()
    rc, _, err = _main(SIM + ["--out", "o", "--force"], capsys)
    assert rc == 0, err
    assert not [f for f in os.listdir(here / "o") if f.startswith((".tmp", ".ddbench-stage"))]


def test_a_manifest_entry_is_honoured_only_with_its_checksum(here, capsys):
    os.makedirs("o")
    (here / "o" / "notes.txt").write_text("mine\n")
    (here / "o" / ".ddbench-manifest.json").write_text(json.dumps(
        {"schema": 1, "files": {"notes.txt": {"live": True, "command": "ddbench simulate"}}}))
    rc, _, err = _main(SIM + ["--out", "o", "--force"], capsys)
    assert rc == 0, err
    assert (here / "o" / "notes.txt").read_text() == "mine\n"


def test_json_to_a_full_stdout_leaves_no_run_folder(tmp_path):
    with open("/dev/full", "w") as full:
        r = subprocess.run(command(*SIM, "--out", "o", "--json"), cwd=tmp_path, env=env(), stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert_one_line_error(r, contains="No space left on device")
    _left(tmp_path)


@pytest.mark.parametrize("args", [["plan", "--help"], ["--version"]])
def test_help_to_a_full_stdout_is_an_error(args):
    with open("/dev/full", "w") as full:
        r = subprocess.run(command(*args), env=env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert_one_line_error(r, contains="No space left on device")


def test_a_closed_stdout_is_one_line(tmp_path):
    r = subprocess.run(command(*SIM, "--out", "o"), cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=60,
                       preexec_fn=lambda: os.close(1))
    assert_one_line_error(r, contains="stdout is closed")
    _left(tmp_path)


def test_a_hang_up_cleans_up_like_ctrl_c(tmp_path):
    p = subprocess.Popen(command("simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "32k",
                                 "--requests", "20000", "--rate", "50", "--quiet", "--out", "o"),
                         cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=default_signals)
    try:
        t0 = time.monotonic()
        while not (os.path.isdir(tmp_path / "o") and os.listdir(tmp_path / "o")) and time.monotonic() - t0 < 60:
            time.sleep(0.05)                       # the run has made its staging folder
        assert p.poll() is None
        p.send_signal(signal.SIGHUP)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "ddbench: interrupted", (p.returncode, err)
    _left(tmp_path)


# ---------------------------------------------------------------- resumed sweep points

def test_a_resumed_sweep_checks_its_stored_points(here, capsys):
    (here / "s.yaml").write_text(SPEC)
    rc, _, err = _main(["sweep", "s.yaml", "--out", "sw", "--workers", "1", "--quiet"], capsys)
    assert rc == 0, err
    store = here / "sw" / "points.jsonl"
    row = json.loads(store.read_text())
    store.write_text(json.dumps(dict(row, tokens_per_s=-1)) + "\n")
    _one_line(["sweep", "s.yaml", "--out", "sw", "--workers", "1", "--quiet"], capsys,
              "points.jsonl line 1", "tokens_per_s is -1")
    store.write_text(json.dumps(dict(row, context="32k")) + "\n")
    _one_line(["sweep", "s.yaml", "--out", "sw", "--workers", "1", "--quiet"], capsys, "context is '32k'")
    store.write_bytes(bytes(range(256)) * 4)
    _one_line(["sweep", "s.yaml", "--out", "sw", "--workers", "1", "--quiet"], capsys,
              "not a store of sweep points")
    assert "-1" not in (here / "sw" / "results.csv").read_text().split("\n")[1].split(",")


# ---------------------------------------------------------------- extras

@pytest.mark.parametrize("argv, missing, says", [
    (["sweep", "s.yaml", "--out", "o"], "pyarrow", "sweep needs pyarrow, not installed here: pip install -e '.[plan]'"),
    (["profile", "--model", "smollm2", "--layer-accuracy"], "triton", "profile needs triton, not installed here"),
])
def test_a_missing_extra_is_named_at_the_start(tmp_path, argv, missing, says):
    (tmp_path / "s.yaml").write_text(SPEC)
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            f"from ddbench.cli import main\nsys.exit(main({argv!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=60)
    assert_one_line_error(r, contains=says)
    _left(tmp_path, "s.yaml")


def test_a_yaml_file_without_pyyaml_names_the_extra(tmp_path):
    (tmp_path / "g.yaml").write_text(GPU)
    argv = ["plan", "--model", "llama-3-8b", "--gpu", "g.yaml", "--context", "8k"]
    code = f"import sys; sys.modules['yaml'] = None\nfrom ddbench.cli import main\nsys.exit(main({argv!r}))"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=60)
    assert_one_line_error(r, contains="GPU file g.yaml: reading YAML needs pyyaml, not installed here")


# ---------------------------------------------------------------- smaller ones

def test_an_accuracy_csv_cut_inside_a_quoted_field_is_refused(here, capsys):
    (here / "acc.csv").write_text("layer,hit_rate,command\n" + "".join(f'{i},0.5,"ddbench profile"\n'
                                                                        for i in range(32))[:-3])
    _one_line(SIM + ["--hit-rate", "acc.csv", "--out", "o"], capsys, "accuracy profile acc.csv", "cut short")
    _left(here, "acc.csv")


def test_a_seed_given_twice_is_refused(here, capsys):
    _one_line(["plan", "--model", "llama-3-8b", "--gpu", "h200", "--context", "8k", "--slo", "p99-tpot=100ms",
               "--seeds", "0,0"], capsys, "--seeds", "gives 0 twice")


def test_the_readme_promises_hang_up_and_disk_full():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    promises = text[text.index("What every command promises"):]
    assert "SIGHUP" in promises and "full" in promises


def test_console_script_and_module_share_the_interrupt_exit():
    """The `ddbench` console script and `python -m ddbench` both enter through ddbench.cli.run: a run that main()
    reports interrupted (130, cleaned up) leaves with exit 130 through os._exit, never as a death by SIGINT."""
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        assert tomllib.load(f)["project"]["scripts"]["ddbench"] == "ddbench.cli:run"
    code = ("import ddbench.cli as c, atexit, os, signal\n"
            "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT))\n"   # what a late interrupt would do
            "c.main = lambda: 130\nc.run()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 130, (p.returncode, p.stderr)
