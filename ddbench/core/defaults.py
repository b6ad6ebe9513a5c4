"""Every default of a scenario, in one place.

The Workload dataclass (ddbench/core/workload.py), the scenario (ddbench/planner/scenario.py), the
sweep spec (ddbench/planner/spec.py) and the flags of simulate, plan and sweep read their defaults
here; nothing else restates them. Limits that keep a value in range (and the arithmetic on it
finite) are here too.
"""

from ddbench.core.designs import DUALDECODER

# ---------------------------------------------------------------- workload (ShadowKV's defaults)
BATCH = 1                  # concurrent decoding requests
BUDGET = 2048              # sparse budget in tokens
CHUNK = 8                  # tokens per chunk
RANK = 160                 # low-rank key rank
LOCAL_CHUNKS = 4           # most recent chunks kept exact on the GPU
GEN_TOKENS = 128           # generated-token slots kept on the GPU
OUTLIERS_PER_1K = 24       # ShadowKV outlier chunks per 1024 tokens of budget
QUANT_GROUP = 64           # SpeCache/KIVI quantization group size
QUANT_RESIDUAL = 64        # SpeCache/KIVI newest tokens kept in 16 bits
LOWRANK_LAYERS = 0         # DualDecoder layers with low-rank keys
PREFILL_CHUNK = 8192       # tokens per chunked-prefill pass
CACHE_TOKENS = 2 * BUDGET  # dualdecoder-cache: GPU chunk cache per (layer, KV head), tokens (2x the budget)
KV_BITS = 16               # bits of the KV kept on the host and moved over the link (16: bf16; 8: fp8 e4m3)
CACHE_BITS = 16            # bits of a chunk-cache design's GPU chunk cache (16: bf16; 8: fp8 e4m3, needs KV_BITS 8)
INDEX = "flat"             # the landmark designs' selection index (ddbench/core/index.py): flat bf16, fp8, int4, two-level
CACHE_POLICY = "lru"       # dualdecoder-cache: eviction policy of the GPU chunk cache

# ---------------------------------------------------------------- scenario
CONTEXT = "128k"           # prompt tokens (simulate; plan requires --context)
OUTPUT = "256"             # output tokens per request
DESIGN = DUALDECODER       # simulate's design
DESIGNS = "all"            # plan's designs: the paper's four
BUFFERS = "design"         # sparse-KV buffer layout: the design's own (or pingpong, per-layer)
PREFILL = "here"           # prefill beside decode on this GPU
HIT_RATE = 0.88            # where no profile prices a design (ddbench.core.rates; said first in every answer):
                           # the paper's average KV prediction accuracy (§4.1)
FORCED_MISS = 0.174        # the engine's forced miss of its calibration phases (EngineConfig, floor, mechanism);
                           # --point and the paper phase take each design's matched rates (ddbench.core.rates)
PROFILE_INIT = "t2"        # accuracy profile rows: the first speculative token is the pre-decoded T2 (§4.1)
PROFILE_TEMPERATURE = 0.6  # ... and the output token sampled at 0.6 (ShadowKV's benchmark setting)

# ---------------------------------------------------------------- serving runs and searches
RATE = 0.05                # simulate: Poisson arrivals, requests/s
SEED = 0
STEPS = 12                 # simulate timeline mode: batch steps
SIM_REQUESTS = 100         # simulate: requests per run
PLAN_REQUESTS = 1000       # plan: requests per simulator run of a search
SWEEP_REQUESTS = 2000      # sweep spec: requests per point
SEEDS = (0,)               # plan: a rate passes only if every seed does
TOL = 0.05                 # plan: relative rate tolerance of the search
MAX_RUNS = 12              # plan: simulator runs per design or setting
MAX_POINTS = 2000          # sweep: a larger grid needs --yes

# ---------------------------------------------------------------- limits (values outside are bad input)
MAX_TOKENS = 1 << 40       # any token count (context, budget, output, ...)
MAX_COUNT = 1 << 40        # any other count (batch, chunk, rank, layers, ...)
MAX_REQUESTS = 10_000_000  # requests per run
MAX_STEPS = 100_000        # timeline batch steps
MIN_RATE, MAX_RATE = 1e-9, 1e9   # arrival rates, requests/s: arrival times stay finite
MAX_HOST_MEM_GB = 1e9      # --host-mem / host_mem_gb, GB for one GPU's requests (an exabyte: any real host fits)
