"""kernels/engine/tables.py renders the engine's result tables from a sweep summary (CPU)."""

import json
import subprocess
import sys

from ddbench.kernels.engine.tables import main, plain, render


def _sweep(tmp_path):
    summary = {"provenance": {"gpu": "G", "git_sha": "abc", "date_utc": "d", "command": "c"}, "hbm_copy_gbps": 4000,
               "ratios": {"step_over_floor": {"dualdecoder|32768|1": dict(step_ms=6.0, floor_ms=4.0, step_over_floor=1.5)},
                          "dual_over_single": {"32768|1": 1.07},
                          "mechanism": {"fifo_over_priority_b16_m0.33": dict(n=3, min=0.99, median=1.01, max=1.05, clear=False),
                                        "fifo_over_priority_b4_m0.174": dict(n=3, min=1.02, median=1.03, max=1.035, clear=True)}}}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "rows.jsonl").write_text(json.dumps({"row": dict(phase="floor", design="full-kv", context=32768, batch=1,
                                                                    miss_rate="none", status="oom")}) + "\n")
    return str(tmp_path)


def test_render_from_summary(tmp_path):
    text = render(_sweep(tmp_path))
    assert "| dualdecoder | 32K | 6.00 / 4.00 ms (**1.50**) | not run | not run |" in text
    assert "| full-kv | 32K | oom | not run | not run |" in text
    assert "1.07 / - / - at 32K" in text
    lines = [x for x in text.splitlines() if x.startswith("| FIFO")]
    assert lines[0].startswith("| FIFO / priority | batch 4, 17.4 % misses | 1.030 (1.020-1.035) | 3 | yes |")
    assert "| batch 16, 33.0 % misses | 1.010 (0.990-1.050) | 3 | no |" in lines[1]


def test_not_a_sweep_exits_2(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddbench.kernels.engine.tables", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_plain_and_markdown_output(tmp_path, capsys):
    """Plain text by default (aligned columns, no markdown marks); --markdown a section with headings
    whose tables are render()'s."""
    folder = _sweep(tmp_path)
    assert main([folder]) == 0
    text = capsys.readouterr().out
    assert "|" not in text and "**" not in text
    row = next(x for x in text.splitlines() if x.startswith("dualdecoder "))
    assert row.split() == ["dualdecoder", "32K", "6.00", "/", "4.00", "ms", "(1.50)", "not", "run", "not", "run"]
    head = next(x for x in text.splitlines() if x.startswith("design "))
    assert head.index("context") == row.index("32K")                    # the columns line up
    assert main([folder, "--markdown"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## Engine sweep results") and "### Mechanism ratios" in md
    tables = [x for x in render(folder).splitlines() if x.startswith("|")]
    assert tables and all(x in md.splitlines() for x in tables)
    assert plain("a\n| x | yy |\n| --- | --- |\n| **1** | 2 |\nb") == "a\nx  yy\n1  2\nb"
