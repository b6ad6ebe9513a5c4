"""Multi-GPU hosts: how many GPUs share a PCIe switch and the host's memory (bandwidth and capacity).

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

Host memory is a capacity too: an offloading design pins each request's KV in host memory
(ddbench.core.memory.host_kv_bytes). `host_memory(host, host_mem_gb)` gives the bytes one GPU's
requests may pin: --host-mem GB as given (GB available to THIS GPU's requests), else the host's
`host_mem_gb` divided by its GPU count (every GPU of the host serving, whatever --fetching says),
else None (host memory is not a bound). Nothing is held back for the OS or the serving process.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ddbench.core.catalog.links import LinkSpec, get_link
from ddbench.core.catalog.files import is_file_name, refs_error
from ddbench.core.catalog.lookup import lookup
from ddbench.core.errors import DDBenchError
from ddbench.core.units import plural

DRAM_EFFICIENCY = 0.8   # achievable / nominal host DRAM read bandwidth (assumed, not measured)
GIB = 1 << 30


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
    host_mem_gb: float = 0.0     # host memory capacity, GB (1e9 bytes) per host, all sockets
    host_mem_source: str = ""    # where that capacity comes from (datasheet, paper, or an assumption)

    @property
    def switches(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_switch))


HOSTS: dict[str, HostSpec] = {h.name: h for h in [
    HostSpec("paper-testbed", "h100-80gb", 8, 2, "pcie5", 2 * 8 * 5600 * 8 / 1000,
             source="paper §6: 8 Hopper 80 GB GPUs, 2x Xeon Platinum 8558 (8 channels DDR5-5600 each), PCIe 5;"
                    " the switch layout is not stated: the usual HGX one (2 GPUs per PCIe 5 switch) assumed",
             host_mem_gb=1600.0, host_mem_source="paper §6: 'an aggregated host memory of 1.6TB' (taken as 1600 GB)"),
    HostSpec("hgx-h100", "h100-80gb", 8, 2, "pcie5", 2 * 8 * 4800 * 8 / 1000,
             source="DGX/HGX H100: 4 PCIe 5 switches with 2 GPUs each, 2x Xeon 8480C (8 channels DDR5-4800)",
             host_mem_gb=2048 * GIB / 1e9,
             host_mem_source="NVIDIA DGX H100 datasheet: 2 TB system memory (2 TiB of DIMMs); an HGX H100 server"
                             " of another vendor may have less"),
    HostSpec("hgx-h200", "h200", 8, 2, "pcie5", 2 * 8 * 4800 * 8 / 1000,
             source="HGX H200 (same board layout as HGX H100), 2x Xeon 8480+ (8 channels DDR5-4800)",
             host_mem_gb=2048 * GIB / 1e9,
             host_mem_source="assumed as in NVIDIA's DGX H200 datasheet: 2 TB system memory (2 TiB of DIMMs)"),
    HostSpec("dgx-a100", "a100-80gb", 8, 2, "pcie4", 2 * 8 * 3200 * 8 / 1000,
             source="DGX A100: 4 PCIe 4 switches with 2 GPUs each, 2x EPYC 7742 (8 channels DDR4-3200)",
             host_mem_gb=2048 * GIB / 1e9,
             host_mem_source="NVIDIA DGX A100 datasheet: 2 TB system memory with 80 GB GPUs (the 40 GB model: 1 TB,"
                             " 2 TB optional); 2 TiB of DIMMs"),
    HostSpec("pcie-8gpu-direct", "h100-pcie-80gb", 8, 1, "pcie5", 2 * 12 * 4800 * 8 / 1000,
             source="8 PCIe cards, each on its own CPU root port (no switch), 2x EPYC 9004 (12 channels DDR5-4800)",
             host_mem_gb=1536 * GIB / 1e9,
             host_mem_source="assumed: one 64 GB DIMM per channel, 24 channels (1.5 TiB)"),
    HostSpec("single-h200", "h200", 1, 1, "pcie5", 8 * 4800 * 8 / 1000, sockets=1,
             source="one GPU on its own root port, one socket with 8 channels DDR5-4800 (a plain 1-GPU server)",
             host_mem_gb=128 * GIB / 1e9,
             host_mem_source="assumed: 128 GiB, as on the 1-GPU H200 machine the engine was measured on"),
]}

_ALIASES = {"paper": "paper-testbed", "dgx-h100": "hgx-h100", "dgx-h200": "hgx-h200"}


def get_host(name: str) -> HostSpec:
    h = lookup("host", name, HOSTS, _ALIASES)
    if is_file_name(name):   # your own host: its GPU and link must be known
        from ddbench.core.catalog.gpus import get_gpu
        try:
            get_gpu(h.gpu)
            get_link(h.link)
        except DDBenchError as exc:
            raise refs_error("host", name, exc) from None
    return h


@dataclass(frozen=True)
class HostMemory:
    """The host memory one GPU's requests may pin, and where that figure comes from."""
    bytes_per_gpu: int
    note: str                     # e.g. "200.0 GB per GPU (paper-testbed: 1600 GB / 8 GPUs, all serving; ...)"
    host: str | None = None       # the catalog host it comes from (None: --host-mem)

    @property
    def gb_per_gpu(self) -> float:
        return self.bytes_per_gpu / 1e9


NOT_BOUNDED = "not bounded (no --host or --host-mem)"


def host_memory(host: str | None, host_mem_gb: float | None) -> HostMemory | None:
    """Host memory available to one GPU's requests: `host_mem_gb` (GB for this GPU) where given, else
    the catalog host's capacity divided by its GPUs (all serving), else None (not a bound)."""
    if host_mem_gb is not None:
        if isinstance(host_mem_gb, bool) or not isinstance(host_mem_gb, (int, float)) \
                or not math.isfinite(host_mem_gb) or host_mem_gb <= 0:
            raise DDBenchError(f"host memory must be a positive number of GB, got {host_mem_gb!r}")
        over = f"; overrides {get_host(host).name}'s" if host is not None else ""
        return HostMemory(int(host_mem_gb * 1e9), f"{host_mem_gb:g} GB for this GPU's requests (--host-mem{over})")
    if host is None:
        return None
    h = get_host(host)
    per = h.host_mem_gb / h.gpus
    return HostMemory(int(per * 1e9), f"{per:.1f} GB per GPU ({h.name}: {h.host_mem_gb:.0f} GB / {h.gpus} GPU"
                                      f"{'s, all serving' if h.gpus > 1 else ''}; {h.host_mem_source})", h.name)


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
        return (f"{plural(self.fetching, 'GPU')} of {self.host} fetching at once: {self.per_gpu_gbps:.1f} GB/s per GPU"
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
