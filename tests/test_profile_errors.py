"""Bad input to `ddbench profile`: one line on stderr, exit 2, no trace written (through a subprocess),
and out-of-memory naming the largest context that fits (in process, with a prefill that runs out)."""

import json
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_profile_tiny import profile, tiny_model  # noqa: E402

from ddbench.core.errors import DDBenchError  # noqa: E402
from tests.cli import ROOT, assert_one_line_error  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("m") / "tiny", "llama", max_pos=1024)


def _one_line_exit2(r, pattern, out):
    assert assert_one_line_error(r, 2, pattern).startswith("ddbench: error: ")
    assert not os.path.exists(out) or os.listdir(out) == []


def test_no_model_at_path(tmp_path):
    out = tmp_path / "out"
    r = profile("--layer-accuracy", "--model", str(tmp_path / "nothing"), "--out", str(out))
    _one_line_exit2(r, "no model at", out)


def _in_process(out, **kw):
    """run() with a small config: the checks the CLI runs, without a process each (the subprocess tests
    here show the one-line exit 2 they turn into)."""
    from ddbench.profile.layersweep import ProfileConfig, run
    run(ProfileConfig(**(dict(tasks=("single",), steps=2, device="cpu", out=str(out), progress=False) | kw)))


def test_unsupported_architecture(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 32}))
    (folder / "model.safetensors").write_bytes(b"")
    out = tmp_path / "out"
    with pytest.raises(DDBenchError, match="unsupported architecture 'gpt2'"):
        _in_process(out, model=str(folder))
    assert not os.path.exists(out) or os.listdir(out) == []


def test_context_beyond_positions_and_budget_at_context(tiny, tmp_path):
    out = tmp_path / "out"
    r = profile("--layer-accuracy", "--model", tiny, "--context", "2k", "--budget", "64", "--out", str(out))
    _one_line_exit2(r, "exceeds the model's max_position_embeddings of 1024", out)


@pytest.mark.parametrize("over, message", [
    (dict(contexts=(512,), budgets=(512,)), "budget 512 is at or above the context of 512"),
    (dict(contexts=(512,), budgets=(64,), tasks=("poems",)), "unknown task"),
])
def test_bad_budget_and_task_in_process(tiny, tmp_path, over, message):
    out = tmp_path / "out"
    with pytest.raises(DDBenchError, match=message):
        _in_process(out, model=tiny, **over)
    assert not os.path.exists(out) or os.listdir(out) == []


def test_missing_optional_packages(tiny, tmp_path):
    shadow = tmp_path / "shadow" / "transformers"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('transformers hidden by the test')\n")
    out = tmp_path / "out"
    r = profile("--layer-accuracy", "--model", tiny, "--out", str(out),
                env_extra={"PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), ROOT])})
    _one_line_exit2(r, "pip install -e '.[profile]'", out)


def test_out_of_memory_names_largest_context_that_fits(tiny, tmp_path):
    from ddbench.profile import decode
    from ddbench.profile.layersweep import ProfileConfig, run

    def prefill_limited(model, ids, cache, chunk=1024, bar=None):
        if len(ids) > 700:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
        return decode.prefill(model, ids, cache, chunk=chunk, bar=bar)

    out = tmp_path / "out"
    cfg = ProfileConfig(model=tiny, contexts=(1000,), tasks=("single",), steps=2, budgets=(64,), device="cpu",
                        out=str(out), progress=False)
    with pytest.raises(DDBenchError, match="out of memory at context 1000 on cpu; the largest context that fits is 512"):
        run(cfg, prefill_fn=prefill_limited)
    assert not os.path.exists(out) or os.listdir(out) == []


def test_sliding_window_shorter_than_context(tmp_path):
    folder = tiny_model(tmp_path / "tiny-mistral", "mistral", sliding_window=256)
    out = tmp_path / "out"
    with pytest.raises(DDBenchError, match="exceeds the model's sliding window of 256"):
        _in_process(out, model=folder, contexts=(512,), budgets=(64,))
    assert not os.path.exists(out) or os.listdir(out) == []
