"""ddbench: a replay and extension of DualDecoder (predictive sparse-KV prefetch).

This package imports nothing heavy at import time; GPU code lives in `kernels/`
and is imported lazily by the commands that need it.
"""

__version__ = "0.1.0"
