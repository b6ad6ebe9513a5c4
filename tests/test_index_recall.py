"""ddbench/profile/indexrecall.py: the recall of the flat top-k under each index, on fresh random queries and
landmarks (the real-model run is `python -m ddbench.profile.indexrecall`, committed under traces/accuracy/)."""

import pytest
import torch

from ddbench.profile import indexrecall


def _inputs(seed, N=96, d=64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 1, 6, d, generator=g)
    lm = torch.randn(1, 2, N, d, generator=g) * torch.rand(1, 1, 1, d, generator=g) * 2
    return q, lm


def test_flat_is_the_reference_and_low_bits_lose_some():
    q, lm = _inputs(1)
    r = indexrecall.layer_recall(q, lm, 8)
    assert set(r) == set(indexrecall.GRID) and all(v.shape == (2,) for v in r.values())
    assert torch.equal(r["flat"], torch.ones(2))
    assert all(0 <= float(v.min()) and float(v.max()) <= 1 for v in r.values())
    assert float(r["fp8"].mean()) >= float(r["int4"].mean())
    assert float(r["two-level:8,1,int4"].mean()) < 1                  # some of the reference is missed


def test_two_level_keeping_every_super_chunk_recalls_all():
    q, lm = _inputs(2, N=32)
    r = indexrecall.layer_recall(q, lm, 8, specs=("two-level:4,1", "two-level:2,2"))
    assert torch.equal(r["two-level:4,1"], torch.ones(2)) and torch.equal(r["two-level:2,2"], torch.ones(2))


@pytest.mark.parametrize("argv, message", [(["--contexts", "0"], "context"), (["--shares", "1"], "--shares"),
                                           (["--steps", "nan"], "--steps")])
def test_bad_input_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        indexrecall.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and message in err[0]


def test_a_second_model_keeps_the_first_models_files(tmp_path):
    """One model's run writes its own two files; another model's, written before by the same command, stay (a
    Gemma run once pruned SmolLM2's)."""
    import json
    row = dict(model="a", context=2048, budget=32, index="flat", layer=0, recall=1.0, ci95_low=1.0, ci95_high=1.0,
               items=2)
    indexrecall.write(str(tmp_path), [row], {"model": "a"})
    indexrecall.write(str(tmp_path), [dict(row, model="b")], {"model": "b"})
    names = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert names == ["a.index.csv", "a.index.summary.json", "b.index.csv", "b.index.summary.json"]
    files = json.loads((tmp_path / ".ddbench-manifest.json").read_text())["files"]
    assert sorted(files) == names
    indexrecall.write(str(tmp_path), [dict(row, recall=0.5)], {"model": "a"}, force=True)   # a again: a only
    assert "0.5" in (tmp_path / "a.index.csv").read_text() and (tmp_path / "b.index.csv").is_file()
