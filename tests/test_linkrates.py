"""sim/linkrates.py: the link bench's rates for the engine's own launches, and the fp8 pieces priced at them."""

import pytest

from ddbench.sim.linkrates import ENGINE_FP8_IN_FLIGHT, fp8_gather_gbps, slot_gather_gbps


def test_the_engine_fp8_launch_is_the_gathers():
    from ddbench.kernels.gather import FP8_IN_FLIGHT, launch_items
    import torch
    from ddbench.kernels.fp8 import E4M3
    assert ENGINE_FP8_IN_FLIGHT == FP8_IN_FLIGHT
    host = torch.empty(1, dtype=E4M3)
    for programs in (32, 64):      # the engine's prefetch and urgent launches
        assert programs * launch_items(None, programs, host) == ENGINE_FP8_IN_FLIGHT


def test_fp8_rates_come_from_the_committed_link_bench():
    got = fp8_gather_gbps("h200", 2056)      # an fp8 K+V piece of Llama-3-8B (2 x (1 KiB + a scale))
    assert got is not None and got[1] >= 12 and 45 < got[0] < 55
    assert fp8_gather_gbps("h200", 4096) is None           # bf16 pieces: not fp8 rows
    assert fp8_gather_gbps("no-such-gpu", 2056) is None
    assert slot_gather_gbps("h200", 4096)[0] > 45


def test_the_cost_model_prices_fp8_at_the_engine_launch():
    from ddbench.core.catalog import get_gpu, get_link, get_model
    from ddbench.core.calibration import find_bundle, load_bundle
    from ddbench.core.errors import DDBenchError
    from ddbench.sim.costmodel import CostModel
    cm = CostModel(get_model("llama-3-8b"), get_gpu("h200"), get_link("pcie5"), load_bundle(find_bundle("h200")))
    bundle_rate = cm.link_rates("gpu", 2056).h2d_gbps
    fp8 = cm.link_rates("gpu", 2056, fp8=True)
    assert fp8.h2d_gbps == pytest.approx(fp8_gather_gbps("h200", 2056)[0])
    assert fp8.h2d_gbps > 1.2 * bundle_rate          # the bundle's gather keeps 2 pieces in flight, the engine 8
    assert fp8.h2d_t0_s == cm.link_rates("gpu", 2056).h2d_t0_s
    with pytest.raises(DDBenchError, match="1028 B pieces"):  # below the bundle's pieces: still refused
        cm.link_rates("gpu", 1028, fp8=True)
