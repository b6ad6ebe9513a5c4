"""Host-to-device links.

`achievable_gbps` for PCIe 5 is the 55.4 GB/s measured for one 1 GiB pinned
copy on our H200 (ANCHORS.md). The other links have no measurement of ours: their
achievable rate is the nominal rate times the PCIe 5 efficiency measured here
(55.4 / 63.0), and `measured` is False, so every output can say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.core.catalog.lookup import lookup

PCIE5_MEASURED_GBPS = 55.4
PCIE5_NOMINAL_GBPS = 63.0  # 32 GT/s x 16 lanes x 128/130 / 8
PCIE5_EFFICIENCY = PCIE5_MEASURED_GBPS / PCIE5_NOMINAL_GBPS
PCIE5_BIDIR_TOTAL_GBPS = 96.0
BIDIR_EFFICIENCY = PCIE5_BIDIR_TOTAL_GBPS / (2 * PCIE5_MEASURED_GBPS)


@dataclass(frozen=True)
class LinkSpec:
    name: str
    nominal_gbps: float      # per direction, GB/s
    achievable_gbps: float   # per direction, one large pinned copy, GB/s
    measured: bool
    bidir_total_gbps: float  # both directions at once
    source: str = ""


def _scaled(name: str, nominal: float, source: str) -> LinkSpec:
    achievable = nominal * PCIE5_EFFICIENCY
    return LinkSpec(name, nominal, round(achievable, 1), False, round(2 * achievable * BIDIR_EFFICIENCY, 1),
                    source + "; achievable = nominal x PCIe 5 efficiency measured on H200 (not measured)")


LINKS: dict[str, LinkSpec] = {l.name: l for l in [
    _scaled("pcie4", 31.5, "PCIe 4.0 x16: 16 GT/s x 16 x 128/130 / 8"),
    LinkSpec("pcie5", PCIE5_NOMINAL_GBPS, PCIE5_MEASURED_GBPS, True, PCIE5_BIDIR_TOTAL_GBPS,
             "PCIe 5.0 x16 measured on H200: 55.4 GB/s H2D, 96 GB/s both directions"
             " (shared/measurements/h200-link-and-gather.json)"),
    _scaled("pcie6", 121.0, "PCIe 6.0 x16: 64 GT/s PAM4, FLIT mode, about 121 GB/s"),
    _scaled("nvlink-c2c", 450.0, "NVLink-C2C (Grace Hopper): 900 GB/s total, 450 GB/s per direction"),
]}

_ALIASES = {"pcie-4": "pcie4", "pcie-5": "pcie5", "pcie-6": "pcie6", "c2c": "nvlink-c2c",
            "pcie4x16": "pcie4", "pcie5x16": "pcie5", "pcie6x16": "pcie6"}


def get_link(name: str) -> LinkSpec:
    return lookup("link", name, LINKS, _ALIASES)
