"""`ddbench simulate --batch` over several batches (ddbench.planner.batchsweep): the grammar, the table of
tokens/s and step time against batch, "does not fit", the best design and the crossovers, --json,
sweep.csv, --plot through the output guard, and bad input in one line."""

import argparse
import json
import os

import pandas as pd
import pytest

from ddbench.cli import main
from ddbench.planner.batchsweep import MAX_BATCHES, parse_batches, summarize

BASE = ["simulate", "--model", "llama-3-8b", "--gpu", "h200", "--context", "128k", "--steps", "4"]


def _main(argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:
        rc = exc.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# ---------------------------------------------------------------- the grammar
@pytest.mark.parametrize("text, batches", [
    ("8", (8,)), (" 8 ", (8,)), ("1,2,4,8", (1, 2, 4, 8)), ("8,1,4,4", (1, 4, 8)),
    ("1:64", (1, 2, 4, 8, 16, 32, 64)), ("3:40", (3, 6, 12, 24, 40)), ("5:5", (5,)),
    ("1:64:8", (1, 9, 17, 25, 33, 41, 49, 57, 64)), ("1:4:1", (1, 2, 3, 4)), ("1:8,12,16:64:16", (1, 2, 4, 8, 12, 16, 32, 48, 64)),
])
def test_grammar(text, batches):
    assert parse_batches(text) == batches


@pytest.mark.parametrize("text, message", [
    ("", "is empty"), ("0", "must be at least 1"), ("1,0", "must be at least 1"), ("-1:4", "must be at least 1"),
    ("4:2", "starts above its end"), ("1:8:0", "must be at least 1"), ("1:2:3:4", "is not N, LO:HI or LO:HI:STEP"),
    ("1,,2", "has an empty item"), ("x", "is not a whole number"), ("1:nan", "is not a whole number"),
    ("1.5", "is not a whole number"), (f"1:{10 * MAX_BATCHES}:1", f"more than {MAX_BATCHES} batches"),
    ("1:1099511627777", "must be at most"),
])
def test_bad_batches_are_one_line_and_write_nothing(text, message, tmp_path, capsys):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_batches(text)
    rc, out, err = _main(BASE + [f"--batch={text}", "--out", tmp_path / "o"], capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("extra, message", [
    (["--plot", "p.png"], "--plot draws a batch sweep"),
    (["--batch", "4", "--plot", "p.png"], "--plot draws a batch sweep"),
    (["--batch", "1,2", "--trace"], "--trace draws one batch's timeline"),
    (["--batch", "1,2", "--plot", "o/p.png"], "lies inside --out"),
    (["--batch", "1,2", "--plot", "p.txt"], "--plot must name a .png, .pdf or .svg file"),
    (["--batch", "1,2", "--plot", ""], "is empty"),
])
def test_bad_flag_combinations_are_one_line(extra, message, tmp_path, capsys):
    rc, out, err = _main(BASE + ["--out", "o"] + extra, capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err, err
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- ranking and crossovers
def _pt(b, t):
    ok = t is not None
    return {"batch": b, "status": "ok" if ok else "does-not-fit", "tokens_per_s": t,
            "step_ms": b / t * 1e3 if ok else None, "memory_bytes": {"total": 1e9},
            "reason": None if ok else f"batch {b} does not fit"}


def test_summarize_ranks_and_finds_the_crossovers():
    batches = (1, 2, 4, 8)
    points = {"a": [_pt(1, 100), _pt(2, 150), _pt(4, 160), _pt(8, 165)],
              "b": [_pt(1, 50), _pt(2, 160), _pt(4, 300), _pt(8, None)],
              "c": [_pt(1, 10), _pt(2, 20), _pt(4, 40), _pt(8, 80)]}
    s = summarize(points, batches, {"a": 100, "b": 7, "c": 100})
    assert [e["design"] for e in s["best"]] == ["a", "b", "b", "a"]
    assert [r["designs"] for r in s["ranking"]] == [["a", "b", "c"], ["b", "a", "c"], ["b", "a", "c"], ["a", "c"]]
    assert [(c["previous_batch"], c["batch"], c["design"], c["overtakes"]) for c in s["crossovers"]] == \
        [(1, 2, "b", "a")]               # b's drop-out at 8 is no crossover: it does not fit there
    assert s["designs"]["b"]["points"][3]["status"] == "does-not-fit"
    assert s["designs"]["b"]["max_batch"] == 7


def test_no_crossover_where_designs_never_swap():
    s = summarize({"a": [_pt(1, 10), _pt(2, 20)], "b": [_pt(1, 5), _pt(2, 10)]}, (1, 2), {"a": 9, "b": 9})
    assert s["crossovers"] == [] and [e["design"] for e in s["best"]] == ["a", "a"]


# ---------------------------------------------------------------- end to end
def _crossovers_of(sweep):
    """The crossovers recomputed from the sweep's own points."""
    names, batches = list(sweep["designs"]), sweep["batches"]
    t = {n: {p["batch"]: p["tokens_per_s"] for p in sweep["designs"][n]["points"] if p["status"] == "ok"}
         for n in names}
    out = set()
    for prev, b in zip(batches, batches[1:]):
        for a in names:
            for c in names:
                if a != c and all(x in t[n] for x in (prev, b) for n in (a, c)) \
                        and t[a][prev] < t[c][prev] and t[a][b] > t[c][b]:
                    out.add((prev, b, a, c))
    return out


def test_sweep_table_json_csv_and_exit_status(tmp_path, capsys):
    argv = BASE + ["--design", "all", "--batch", "1:128", "--out", tmp_path / "o"]
    rc, out, err = _main(argv + ["--json"], capsys)
    assert rc == 0, err
    sweep = json.loads(out)
    asked = {1, 2, 4, 8, 16, 32, 64, 128}
    largest = {d["max_batch"] for d in sweep["designs"].values() if 1 <= d["max_batch"] <= 128}
    assert largest - asked            # some design's largest batch is not a power of two: it is run too
    assert sweep["mode"] == "batch-sweep" and sweep["batches"] == sorted(asked | largest)
    assert sweep["largest_batches_added"] == sorted(largest - asked)
    assert sweep == json.load(open(tmp_path / "o" / "summary.json")) | {"wall_s": sweep["wall_s"]}
    assert {(c["previous_batch"], c["batch"], c["design"], c["overtakes"]) for c in sweep["crossovers"]} == \
        _crossovers_of(sweep)
    for name, d in sweep["designs"].items():
        for p in d["points"]:    # beyond a design's memory: "does not fit", no throughput
            assert (p["status"] == "ok") == (p["batch"] <= d["max_batch"]), (name, p)
            assert (p["tokens_per_s"] is None) == (p["status"] != "ok")
            if p["status"] == "ok":
                assert p["tokens_per_s"] == pytest.approx(p["batch"] / p["step_ms"] * 1e3)
    assert sweep["designs"]["full-kv"]["points"][-1]["status"] == "does-not-fit"
    best = {e["batch"]: e["design"] for e in sweep["best"]}
    for e in sweep["ranking"]:
        assert best[e["batch"]] == (e["designs"][0] if e["designs"] else None)
    csv = pd.read_csv(tmp_path / "o" / "sweep.csv")       # plain: one header line
    assert len(csv) == 5 * len(asked | largest) and set(csv.design) == set(sweep["designs"])
    assert (csv.status == "does-not-fit").sum() == sum(p["status"] != "ok" for d in sweep["designs"].values()
                                                       for p in d["points"])
    # the text: the table, "does not fit", the best by batch and every crossover
    rc, out, err = _main(argv + ["--force"], capsys)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("batch sweep: llama-3-8b on h200") and "does not fit" in out
    assert any(ln.startswith("best by batch: ") for ln in lines)
    for c in sweep["crossovers"]:
        assert any(f"batch {c['previous_batch']} -> {c['batch']}: {c['design']}" in ln and c["overtakes"] in ln
                   for ln in lines), c
    if not sweep["crossovers"]:
        assert any(ln.startswith("crossovers: none") for ln in lines)


def test_sweep_where_nothing_fits_is_exit_3_with_the_folder_written(tmp_path, capsys):
    rc, out, _ = _main(BASE + ["--design", "full-kv,shadowkv", "--batch", "4096,8192", "--out", tmp_path / "o"],
                       capsys)
    assert rc == 3 and "nothing fits at batches 4096-8192" in out
    assert (tmp_path / "o" / "sweep.csv").exists()


def test_plot_goes_through_the_output_guard(tmp_path, capsys):
    png = tmp_path / "plots" / "sweep.png"
    argv = BASE + ["--design", "shadowkv,dualdecoder-cache", "--batch", "2,8,64", "--plot", png]
    rc, out, err = _main(argv + ["--out", tmp_path / "o1"], capsys)
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {tmp_path / 'o1'}, {png}" in " ".join(out.split())   # wrapped at 120
    manifest = json.load(open(png.parent / ".ddbench-manifest.json"))
    assert "sweep.png" in json.dumps(manifest)
    rc, out, err = _main(argv + ["--out", tmp_path / "o2"], capsys)    # its own earlier plot: only with --force
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--force" in err
    assert not (tmp_path / "o2").exists()                               # nothing of the run is left
    rc, out, err = _main(argv + ["--out", tmp_path / "o2", "--force"], capsys)
    assert rc == 0, err
    foreign = tmp_path / "mine.svg"
    foreign.write_text("a user's file")
    rc, out, err = _main(argv[:-1] + [foreign, "--out", tmp_path / "o3", "--force"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert foreign.read_text() == "a user's file" and not (tmp_path / "o3").exists()


# ---------------------------------------------------------------- the plot
def _fake(tput: dict[str, list[float]], batches=(1, 2, 4, 8)) -> dict:
    pts = {n: [{"batch": b, "status": "ok", "tokens_per_s": t, "step_ms": 1000.0 * b / t,
                "memory_bytes": {"total": 1e9}} for b, t in zip(batches, ts)] for n, ts in tput.items()}
    return summarize(pts, batches, {n: 64 for n in tput})


def test_only_the_crossover_that_changes_the_best_design_is_marked():
    # a leads, b overtakes c at 2 -> 4 (a stays best), then c overtakes a at 4 -> 8 (the best changes)
    s = _fake({"a": [10, 10, 10, 10], "b": [5, 8, 9, 8.5], "c": [6, 7, 8, 12]})
    from ddbench.planner.batchsweep import winner_changes
    assert len(s["crossovers"]) > len(winner_changes(s)) == 1
    (w,) = winner_changes(s)
    assert (w["previous_batch"], w["batch"], w["design"], w["overtakes"]) == (4, 8, "c", "a")


def test_plot_keeps_the_title_and_every_line_visible():
    import matplotlib
    matplotlib.use("Agg")
    from ddbench.planner.batchsweep import draw
    s = _fake({"a": [10, 10, 10, 10], "b": [10, 10, 10, 10], "c": [6, 7, 8, 12]})   # a and b on top of each other
    title = "llama-3-8b on h200 (150.1 GB), pcie5, context 128K, 4 steps per batch (2 warm-up); " * 3
    fig = draw(s, title)
    fig.canvas.draw()
    box = fig.bbox
    t = fig._suptitle.get_window_extent()
    assert box.x0 <= t.x0 and t.x1 <= box.x1 and t.y1 <= box.y1, (t, box)
    lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label() in ("a", "b", "c")]
    assert len({(ln.get_linestyle(), ln.get_marker()) for ln in lines}) == 3
    a, b = (next(ln for ln in lines if ln.get_label() == x) for x in "ab")
    assert a.get_markersize() > b.get_markersize() and a.get_zorder() < b.get_zorder()   # b drawn inside a
    circles = [c for c in fig.axes[0].collections]
    assert len(circles) == 1 and len(circles[0].get_offsets()) == 1
    import matplotlib.pyplot as plt
    plt.close(fig)
