"""`ddbench profile --layer-accuracy`: per-layer KV-prediction accuracy of a real model.

    model.py      load a Hugging Face folder or a .gguf (transformers, offline); supported families
    tasks.py      seeded RULER-style prompts (single/multi-key needle, multi-value, variable tracking)
    attention.py  the registered attention + mask function: query capture, sparse attention
    decode.py     chunked prefill; the dual-token decode loop (output + speculative token)
    selection.py  the project's chunk-selection rule (kernels' torch twins), resident tokens
    metrics.py    hit / reuse / union / new-prediction share of three selections
    lowrank.py    ShadowKV's low-rank pre-RoPE keys
    quality.py    task accuracy: dense, sparse exact top-k, low-rank keys
    trace.py      the trace schema (traces/accuracy/) and atomic writing
    run.py        the sweep

Everything here imports torch and transformers lazily (inside functions), so `ddbench --help`
and the torch-free commands never load them.
"""
