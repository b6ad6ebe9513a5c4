"""kernels/engine/results.ratios: step/floor and dual/single come from the model's own selection, not
from the floor phase's forced-miss twins of the same design, context and batch (CPU)."""

import pytest

results = pytest.importorskip("ddbench.kernels.engine.results")


def _row(design, miss, step, tokens=2):
    return dict(phase="floor", rep=0, design=design, context=32768, batch=1, miss_rate=miss, transfers=0, graph=1,
                status="ok", step_ms=step, floor_ms=4.0, step_over_floor=step / 4.0, tokens=tokens)


@pytest.mark.parametrize("forced_first", [False, True])
def test_floor_ratios_ignore_forced_miss_twins(forced_first):
    own = [_row("dualdecoder", "none", 6.0), _row("dualdecoder-single", "none", 5.0, tokens=1)]
    forced = [_row("dualdecoder", 0.174, 9.0)]
    rows = forced + own if forced_first else own + forced
    r = results.ratios(rows)
    assert r["step_over_floor"]["dualdecoder|32768|1"]["step_ms"] == 6.0
    assert r["dual_over_single"]["32768|1"] == pytest.approx(6.0 / 5.0)
