"""GPUs: memory capacity, HBM bandwidth, dense bf16 rate and the usual host link.

`hbm_bytes` is the total the driver reports (nvidia-smi "memory.total" in MiB,
or cudaMemGetInfo where we measured it). Bandwidth and FLOP/s are the vendors'
datasheet figures (dense, no sparsity) unless `source` says measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddbench.core.catalog.files import is_file_name, refs_error
from ddbench.core.catalog.lookup import lookup
from ddbench.core.errors import DDBenchError

MIB = 1024 ** 2


@dataclass(frozen=True)
class GPUSpec:
    name: str
    hbm_bytes: int
    hbm_gbps: float          # datasheet HBM bandwidth, GB/s
    bf16_tflops: float       # datasheet dense bf16 tensor-core rate, TFLOP/s
    default_link: str
    runtime_overhead_bytes: int = 623_706_112  # CUDA context + cuBLAS, measured on our H200
    measured_hbm_gbps: float | None = None     # device-to-device copy (read+write) where measured
    source: str = ""
    fp8: bool = True                            # fp8 (e4m3) tensor and conversion support (Ada, Hopper, Blackwell)


GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    GPUSpec("a100-40gb", 40960 * MIB, 1555.0, 312.0, "pcie4",
            source="nvidia-smi 40960 MiB; A100 datasheet (SXM4 40GB)", fp8=False),
    GPUSpec("a100-80gb", 81920 * MIB, 2039.0, 312.0, "pcie4",
            source="nvidia-smi 81920 MiB; A100 datasheet (SXM4 80GB)", fp8=False),
    GPUSpec("h100-80gb", 81559 * MIB, 3350.0, 989.0, "pcie5",
            source="nvidia-smi 81559 MiB; H100 SXM5 datasheet"),
    GPUSpec("h100-pcie-80gb", 81559 * MIB, 2000.0, 756.0, "pcie5",
            source="nvidia-smi 81559 MiB; H100 PCIe datasheet"),
    GPUSpec("h200", 150_109_880_320, 4800.0, 989.0, "pcie5", measured_hbm_gbps=4140.0,
            source="cudaMemGetInfo total and D2D copy measured here (shared/measurements/h200-memory.json,"
                   " h200-link-and-gather.json); H200 SXM datasheet for bandwidth and FLOP/s"),
    GPUSpec("gh200", 97871 * MIB, 4000.0, 989.0, "nvlink-c2c",
            source="nvidia-smi 97871 MiB (96 GB HBM3 part); GH200 datasheet"),
    GPUSpec("l40s", 46068 * MIB, 864.0, 362.0, "pcie4",
            source="nvidia-smi 46068 MiB; L40S datasheet"),
    GPUSpec("b200", 183359 * MIB, 8000.0, 2250.0, "pcie5",
            source="nvidia-smi 183359 MiB; HGX B200 datasheet (hosts are PCIe 5)"),
]}

_ALIASES = {"h100": "h100-80gb", "h100-sxm": "h100-80gb", "h100-sxm-80gb": "h100-80gb",
            "h100-pcie": "h100-pcie-80gb", "a100": "a100-80gb", "h200-141gb": "h200"}


def get_gpu(name: str) -> GPUSpec:
    g = lookup("GPU", name, GPUS, _ALIASES)
    if is_file_name(name):   # your own GPU: its default link must be known
        from ddbench.core.catalog.links import get_link
        try:
            get_link(g.default_link)
        except DDBenchError as exc:
            raise refs_error("GPU", name, exc) from None
    return g


def catalog_gpu_name(device_name: str, total_bytes: int) -> str:
    """The catalog name of a GPU as the driver names it; the one rule for trace folders
    (traces/<kind>/<catalog name>/). Unknown devices get a slug of their name."""
    n = device_name.upper()
    gib = total_bytes / 1024 ** 3
    if "GH200" in n:
        return "gh200"
    if "H200" in n:
        return "h200"
    if "H100" in n:
        return "h100-pcie-80gb" if "PCIE" in n else "h100-80gb"
    if "A100" in n:
        return "a100-40gb" if gib < 60 else "a100-80gb"
    if "L40S" in n:
        return "l40s"
    if "B200" in n:
        return "b200"
    return "".join(ch if ch.isalnum() else "-" for ch in device_name.lower()).strip("-")
