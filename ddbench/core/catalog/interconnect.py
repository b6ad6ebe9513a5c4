"""GPU-to-GPU interconnect: what one all-reduce of tensor parallelism costs, by message size and ranks.

Tensor parallelism (ddbench.core.tp) all-reduces the hidden state twice per layer (after the attention's
output projection and after the MLP's down projection). Its time comes from a published nccl-tests table,
never from a guess, where the GPUs are joined by NVLink:

    NVLINK_HOPPER  all_reduce_perf (nccl-tests 2.18.3, NCCL 2.29.2), 4x H100 80GB HBM3 SXM over NVLink 4 /
                   NVSwitch, out-of-place time by message size: up to 16 MB with CUDA-graph capture (graph 1,
                   as serving engines replay their decode steps), above that from the same box's eager sweep
                   (graph 0). waynehacking8/nccl-collectives-bench, results/symmetric/all_reduce_reg0_graph1.txt
                   and results/all_reduce.txt (published 2026-05-31). Peak busbw there 366 GB/s; 8x H200 reach
                   475 GB/s (NVIDIA/nccl-tests#272, NCCL 2.20.3) and NCCL's maintainer gives ~480 GB/s for 8x
                   H100 with NVLink SHARP (NVIDIA/nccl-tests#212): so the 4-GPU table is, if anything, slow at
                   8 GPUs' large messages.

Other rank counts: a ring all-reduce moves 2(N-1)/N of the message over each GPU's link, so an N-rank
all-reduce of S bytes is priced as the measured 4-rank one of S * f(N) / f(4) bytes, f(N) = 2(N-1)/N
(same busbw, same latency floor; assumed, not measured at 2 or 8 ranks). GPUs without NVLink (PCIe cards,
L40S, GH200 alone) have no published table here: their all-reduce is ESTIMATED as the NVLink table's
latency floor plus f(N) * S at the PCIe link's achievable rate, and every answer says so.

    t = allreduce_s(gpu, nbytes, ranks, link_gbps)    # seconds; 0 for one rank
    interconnect_of(gpu).describe()                   # the one-line source every answer prints
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# (message bytes, out-of-place microseconds), 4 ranks: graph-1 rows to 16 MB, graph-0 rows above
_HOPPER_4RANK = (
    (8, 16.08), (1024, 16.88), (16384, 16.19), (65536, 16.76), (131072, 17.26), (262144, 17.38),
    (524288, 20.12), (1048576, 24.00), (2097152, 34.62), (4194304, 47.78), (8388608, 67.73),
    (16777216, 105.81), (33554432, 176.20), (67108864, 325.86), (134217728, 617.77), (268435456, 1181.43),
    (536870912, 2311.72), (1073741824, 4511.11), (2147483648, 8923.11), (4294967296, 17735.5),
    (8589934592, 35168.9),
)
MEASURED_RANKS = 4
HOPPER_SOURCE = ("nccl-tests all_reduce_perf, 4x H100 SXM over NVLink 4, NCCL 2.29.2,"
                 " github.com/waynehacking8/nccl-collectives-bench")
NVLINK_GPUS = {"h100-80gb": "", "h200": "",
               "a100-40gb": "Hopper's table, not measured on A100's NVLink 3",
               "a100-80gb": "Hopper's table, not measured on A100's NVLink 3",
               "b200": "Hopper's table, not measured on B200's NVLink 5"}


def ring_factor(ranks: int) -> float:
    """Bytes over each GPU's link per byte all-reduced by a ring of `ranks`: 2(N-1)/N."""
    return 2.0 * (ranks - 1) / ranks


def _table_us(nbytes: float) -> float:
    """The 4-rank table at `nbytes`, linear between rows; its floor below, its last busbw above."""
    sizes = [s for s, _ in _HOPPER_4RANK]
    if nbytes <= sizes[0]:
        return _HOPPER_4RANK[0][1]
    i = bisect_left(sizes, nbytes)
    if i >= len(sizes):
        s, t = _HOPPER_4RANK[-1]
        return t * nbytes / s
    (s0, t0), (s1, t1) = _HOPPER_4RANK[i - 1], _HOPPER_4RANK[i]
    return t0 + (t1 - t0) * (nbytes - s0) / (s1 - s0)


@dataclass(frozen=True)
class Interconnect:
    name: str                 # "nvlink" or "pcie"
    provenance: str           # "published" or "estimated"
    source: str
    caveat: str = ""

    def allreduce_s(self, nbytes: float, ranks: int, link_gbps: float) -> float:
        """Seconds of one all-reduce of `nbytes` (per rank) over `ranks` GPUs (0 for one rank)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        scaled = nbytes * ring_factor(ranks) / ring_factor(MEASURED_RANKS)
        if self.name == "nvlink":
            return _table_us(scaled) * 1e-6
        return _HOPPER_4RANK[0][1] * 1e-6 + nbytes * ring_factor(ranks) / (link_gbps * 1e9)

    def describe(self) -> str:
        extra = f"; {self.caveat}" if self.caveat else ""
        return f"all-reduce over {self.name} ({self.provenance}: {self.source}{extra})"


def interconnect_of(gpu: str) -> Interconnect:
    """How the GPUs of a TP group are joined: NVLink (HGX/SXM boards) with the published table, else PCIe."""
    if gpu in NVLINK_GPUS:
        return Interconnect("nvlink", "published", HOPPER_SOURCE, NVLINK_GPUS[gpu])
    return Interconnect("pcie", "estimated", "no published PCIe all-reduce table here: the NVLink table's"
                        f" {_HOPPER_4RANK[0][1]:.0f} us floor plus 2(N-1)/N of the message at the link's rate")


def allreduce_s(gpu: str, nbytes: float, ranks: int, link_gbps: float) -> float:
    return interconnect_of(gpu).allreduce_s(nbytes, ranks, link_gbps)
