"""Settings a user can deploy: the serving-engine flags a design maps to, only where the engine supports it.

Flag names were checked against the engines' own documentation (docs/planning.md cites each):
- vLLM `--tensor-parallel-size N` (engine arguments) and `--kv-offloading-backend native --kv-offloading-size
  GiB` (CPU KV offloading: a CPU tier of the prefix cache, total over the TP ranks; decode never reads
  sparse KV from it, so it is printed as optional, unmodelled here);
- SGLang `--tp-size N` (server arguments) and HiSparse `--enable-hisparse --hisparse-config
  '{"top_k": ..., "device_buffer_size": ..., "host_to_device_ratio": ...}'`, which today supports only
  DeepSeek Sparse Attention models (DeepSeek-V3.2, GLM-5), on the decode instance of a PD-disaggregated
  deployment, with --disable-radix-cache. No catalog model is a DSA model, so for them the line says so
  instead of printing a command that would not run.

Which design maps to what is read from the registry's switches, never its name: a design that keeps all KV
on the GPU is plain vLLM/SGLang; one with a GPU chunk cache over host KV is HiSparse's mechanism; the others
(landmark prefetch, low-rank keys, quantized copies) have no engine feature.
"""

from __future__ import annotations

import math

NO_FEATURE = "deploy: no vLLM or SGLang feature"
DSA_MODEL_TYPES = ("deepseek_v32", "glm5")    # HiSparse's supported architectures (SGLang's HiSparse guide)


def deploy_lines(design, model, tp: int, workload, host_gb_per_replica: float | None) -> list[str]:
    """One or two short lines: the flags to serve `design` of `model` at TP `tp`, or why there are none."""
    tpf = f"--tensor-parallel-size {tp}"
    if design.kv_on_gpu:
        out = [f"deploy: vllm serve MODEL {tpf}; python -m sglang.launch_server --model-path MODEL --tp-size {tp}"]
        if host_gb_per_replica:
            out.append(f"  optional CPU prefix-cache tier (vLLM, unmodelled here): --kv-offloading-backend native"
                       f" --kv-offloading-size {math.floor(host_gb_per_replica * 1e9 / 2 ** 30)}")
        return out
    if design.chunk_cache:
        cfg = (f'{{"top_k": {workload.budget}, "device_buffer_size": {workload.cache_tokens},'
               f' "host_to_device_ratio": {max(1, math.ceil(workload.context / workload.cache_tokens))}}}')
        if getattr(model, "model_type", "") in DSA_MODEL_TYPES:
            return [f"deploy: sglang --tp-size {tp} --disaggregation-mode decode --disable-radix-cache"
                    f" --enable-hisparse --hisparse-config '{cfg}'"]
        return [f"deploy: SGLang HiSparse runs only DeepSeek Sparse Attention models, not {model.name}: no command"]
    return [NO_FEATURE]
