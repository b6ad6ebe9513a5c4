"""Programmatic dependent launch (kernels/pdl.py): off on the CPU and with DDBENCH_PDL=0; on the GPU a
captured chain of the engine's glue kernels gives bit-equal results with and without it."""
import pytest
import torch

from kernels.pdl import pdl_kw, pdl_on


def test_pdl_off_on_cpu(monkeypatch):
    x = torch.zeros(4)
    assert not pdl_on(x) and pdl_kw(x) == dict(PDL=0)
    monkeypatch.setenv("DDBENCH_PDL", "0")
    assert pdl_kw(x) == dict(PDL=0)


@pytest.mark.gpu
def test_pdl_graph_chain_matches(monkeypatch):
    from kernels.engine import fused
    from kernels.timing import capture_graph
    g = torch.Generator(device="cuda").manual_seed(5)
    x0 = torch.randn(4, 2, 4096, device="cuda", generator=g).bfloat16()
    y0 = torch.randn(4, 2, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.rand(4096, device="cuda", generator=g) + 0.5).bfloat16()
    gu = torch.randn(8, 2 * 4096, device="cuda", generator=g).bfloat16()
    res = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("DDBENCH_PDL", flag)
        assert pdl_on(x0) == (flag == "1" and torch.cuda.get_device_capability() >= (9, 0))
        out = {}

        def body():   # dependent chain: each kernel reads the previous one's output
            s, h = fused.add_rmsnorm(x0, y0, w)
            for _ in range(20):
                s, h = fused.add_rmsnorm(s, h, w)
            out["h"], out["a"] = h, fused.swiglu(gu)

        graph = capture_graph(body, [body])
        for t in out.values():
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        res[flag] = {k: v.clone() for k, v in out.items()}
    for k in res["0"]:
        assert not res["1"][k].isnan().any()
        assert torch.equal(res["0"][k], res["1"][k])
