"""The catalog: models, GPUs, host links and multi-GPU hosts as plain frozen dataclasses.

Nothing here imports anything heavier than the standard library, so the
simulator, the planner and the kernels can all share these specs.
"""

from ddbench.core.catalog.gpus import GPUS, GPUSpec, get_gpu
from ddbench.core.catalog.hosts import (HOSTS, NOT_BOUNDED, HostMemory, HostSpec, fetch_share, get_host, host_memory,
                                        shared_link)
from ddbench.core.catalog.links import LINKS, LinkSpec, get_link
from ddbench.core.catalog.models import MODELS, ModelSpec, get_model, model_from_hf_config

__all__ = [
    "GPUS", "GPUSpec", "get_gpu",
    "HOSTS", "HostSpec", "get_host", "fetch_share", "shared_link", "HostMemory", "host_memory", "NOT_BOUNDED",
    "LINKS", "LinkSpec", "get_link",
    "MODELS", "ModelSpec", "get_model", "model_from_hf_config",
]
