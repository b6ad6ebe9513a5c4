"""ddbench.kernels.linkbench's bad input: one line, exit 2 (the measurement itself runs on a CUDA GPU)."""

import pytest

from ddbench.kernels import linkbench


@pytest.mark.parametrize("argv,word", [(["--sizes", "x"], "--sizes"), (["--sizes", "0,8"], "--sizes"),
                                       (["--sizes", "1024"], "--sizes"), (["--rounds", "0"], "--rounds"),
                                       (["--only", "urgent,bogus"], "--only"), (["--only", ""], "--only")])
def test_bad_flags_one_line(argv, word, capsys):
    assert linkbench.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and word in err


def test_summary_min_median_max():
    rows = [dict(test="gather", variant="fp8", programs=32, items=4, call_bytes=8, gbps=g, pct_of_copy=p)
            for g, p in ((50.0, 90.0), (52.0, 94.0), (51.0, 92.0))]
    (s,) = linkbench.summarise(rows)
    assert s["n"] == 3 and s["gbps"] == dict(min=50.0, median=51.0, max=52.0) and s["pct_of_copy"]["median"] == 92.0
