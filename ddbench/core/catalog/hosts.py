"""Multi-GPU hosts: how many GPUs share a PCIe switch and the host's memory.

An offloading design fetches its sparse KV from pinned host memory over the GPU's link. On a
multi-GPU host that link is not the GPU's alone:
- the GPUs behind one PCIe switch share the switch's x16 uplink to the CPU root port;
- all GPUs read the same host DRAM (each socket's memory serves the GPUs attached to it).

`fetch_share` gives the per-GPU host-to-device rate when `n` GPUs of the host fetch at once:

    per GPU = min(link achievable,
                  link achievable / k              k = fetching GPUs per switch = ceil(n / switches),
                  DRAM_EFFICIENCY x host_mem_gbps / n)

It assumes the fetching GPUs are spread evenly over the switches (the best placement) and each
GPU's KV lives in the memory of the socket it hangs off. Nothing here was measured: switch
layouts are the vendors' published block diagrams (or, for the paper's testbed, the usual HGX
layout; the paper does not state it), host memory bandwidth is channels x DDR rate x 8 bytes,
and DRAM_EFFICIENCY is the share of it a STREAM-like read reaches on such servers (assumed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ddbench.core.catalog.links import LinkSpec, get_link
from ddbench.core.catalog.lookup import lookup
from ddbench.core.errors import DDBenchError

DRAM_EFFICIENCY = 0.8   # achievable / nominal host DRAM read bandwidth (assumed, not measured)


@dataclass(frozen=True)
class HostSpec:
    name: str
    gpu: str                 # catalog GPU name
    gpus: int                # GPUs per host
    gpus_per_switch: int     # GPUs sharing one PCIe switch uplink (1 = each GPU on its own root port)
    link: str                # catalog link of each GPU (and of each switch uplink)
    host_mem_gbps: float     # nominal host DRAM bandwidth, all sockets, GB/s
    sockets: int = 2
    source: str = ""

    @property
    def switches(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_switch))


HOSTS: dict[str, HostSpec] = {h.name: h for h in [
    HostSpec("paper-testbed", "h100-80gb", 8, 2, "pcie5", 2 * 8 * 5600 * 8 / 1000,
             source="paper §6: 8 Hopper 80 GB GPUs, 2x Xeon Platinum 8558 (8 channels DDR5-5600 each), PCIe 5;"
                    " the switch layout is not stated: the usual HGX one (2 GPUs per PCIe 5 switch) assumed"),
    HostSpec("hgx-h100", "h100-80gb", 8, 2, "pcie5", 2 * 8 * 4800 * 8 / 1000,
             source="DGX/HGX H100: 4 PCIe 5 switches with 2 GPUs each, 2x Xeon 8480C (8 channels DDR5-4800)"),
    HostSpec("hgx-h200", "h200", 8, 2, "pcie5", 2 * 8 * 4800 * 8 / 1000,
             source="HGX H200 (same board layout as HGX H100), 2x Xeon 8480+ (8 channels DDR5-4800)"),
    HostSpec("dgx-a100", "a100-80gb", 8, 2, "pcie4", 2 * 8 * 3200 * 8 / 1000,
             source="DGX A100: 4 PCIe 4 switches with 2 GPUs each, 2x EPYC 7742 (8 channels DDR4-3200)"),
    HostSpec("pcie-8gpu-direct", "h100-pcie-80gb", 8, 1, "pcie5", 2 * 12 * 4800 * 8 / 1000,
             source="8 PCIe cards, each on its own CPU root port (no switch), 2x EPYC 9004 (12 channels DDR5-4800)"),
    HostSpec("single-h200", "h200", 1, 1, "pcie5", 8 * 4800 * 8 / 1000, sockets=1,
             source="one GPU on its own root port, one socket with 8 channels DDR5-4800 (a plain 1-GPU server)"),
]}

_ALIASES = {"paper": "paper-testbed", "dgx-h100": "hgx-h100", "dgx-h200": "hgx-h200"}


def get_host(name: str) -> HostSpec:
    return lookup("host", name, HOSTS, _ALIASES)


@dataclass(frozen=True)
class FetchShare:
    """Per-GPU link rate when `fetching` GPUs of a host fetch at once, and what limits it."""
    host: str
    fetching: int
    per_switch: int               # fetching GPUs behind each switch
    alone_gbps: float             # the link's achievable rate, one GPU alone
    switch_gbps: float            # per GPU through the shared uplink
    host_mem_gbps: float          # per GPU out of the host's DRAM
    per_gpu_gbps: float           # the minimum of the three
    limit: str                    # "link" | "switch" | "host memory"

    def describe(self) -> str:
        return (f"{self.fetching} GPUs of {self.host} fetching at once: {self.per_gpu_gbps:.1f} GB/s per GPU"
                f" (alone {self.alone_gbps:.1f}; switch uplink shared by {self.per_switch}: {self.switch_gbps:.1f};"
                f" host DRAM {DRAM_EFFICIENCY:.0%} of nominal / {self.fetching}: {self.host_mem_gbps:.1f};"
                f" bound: {self.limit}; unmeasured)")


def fetch_share(host: HostSpec, fetching: int | None = None, link: str | None = None) -> FetchShare:
    n = host.gpus if fetching is None else int(fetching)
    if not 1 <= n <= host.gpus:
        raise DDBenchError(f"GPUs fetching at once must be within 1..{host.gpus} for host {host.name}, got {n}")
    lk = get_link(link or host.link)
    alone = lk.achievable_gbps
    k = min(host.gpus_per_switch, math.ceil(n / host.switches))
    switch = alone / k
    mem = DRAM_EFFICIENCY * host.host_mem_gbps / n
    per = min(alone, switch, mem)
    limit = "link" if per == alone else ("switch" if per == switch else "host memory")
    return FetchShare(host.name, n, k, alone, switch, mem, per, limit)


def shared_link(link: LinkSpec, share: FetchShare) -> LinkSpec:
    """The link as one GPU sees it while `share.fetching` GPUs fetch at once: achievable and
    bidirectional rates scaled by the per-GPU share (an effective-bandwidth input to the cost
    model). Unchanged where the GPU alone would be no faster."""
    if share.per_gpu_gbps >= link.achievable_gbps:
        return link
    f = share.per_gpu_gbps / link.achievable_gbps
    return replace(link, name=f"{link.name}/{share.host}x{share.fetching}", achievable_gbps=share.per_gpu_gbps,
                   bidir_total_gbps=link.bidir_total_gbps * f, measured=False,
                   source=link.source + f"; {share.describe()}")
