"""Build a cost model from catalog names: the GPU's own bundle, else a measured bundle scaled to it,
else a pure roofline. The choice is written into `CostModel.notes` and so into every output. An
empty name (link, calibration root) is an error, never the default."""

from __future__ import annotations

from ddbench.core.calibration import available_bundles, find_bundle, load_bundle
from ddbench.core.errors import DDBenchError
from ddbench.core.catalog import LinkSpec, get_gpu, get_link, get_model
from ddbench.core.catalog.interconnect import interconnect_of
from ddbench.core.tp import rank_model
from ddbench.sim.costmodel import CostModel

PREFERRED_SOURCE = "h200"


def cost_model(model: str, gpu: str, link: str | LinkSpec | None = None, root: str | None = None,
               roofline: bool = False, tp: int = 1) -> CostModel:
    """`link`: a catalog name, a LinkSpec (e.g. a host-shared link from the planner), or the GPU's own.
    `tp`: price one rank of a tensor-parallel group of that size (ddbench.core.tp)."""
    cm = _cost_model(model, gpu, link, root, roofline, tp)
    if tp > 1:
        cm.set_tensor_parallel(tp, interconnect_of(cm.gpu.name))
    return cm


def _cost_model(model, gpu, link, root, roofline, tp) -> CostModel:
    if root is not None and not str(root).strip():
        raise DDBenchError("the calibration root is empty: name a folder, or leave it out for the data root's")
    m, g = rank_model(get_model(model), tp), get_gpu(gpu)
    lk = link if isinstance(link, LinkSpec) else get_link(g.default_link if link is None else link)
    if roofline:
        return CostModel(m, g, lk, None)
    path = find_bundle(g.name, root)
    if path is None:
        have = available_bundles(root)
        if not have:
            raise DDBenchError(f"no calibration bundle under {root or 'the data root'}; measure one with"
                               f" `ddbench calibrate`, point --calibration at one, or pass --roofline")
        path = find_bundle(PREFERRED_SOURCE if PREFERRED_SOURCE in have else have[0], root)
    return CostModel(m, g, lk, load_bundle(path))
