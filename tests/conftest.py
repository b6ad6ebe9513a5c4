"""Shared test set-up.

Without a CUDA GPU, Triton kernels run through its CPU interpreter: the flag must
be set before any kernel module is imported, so it is set here, first.

Optional packages: a test module that needs one that is not installed (the GPU machine has no
simpy and no nvtx, and cannot install them) is skipped with the reason, never an error at
collection, so `make test-gpu` runs on a fresh CUDA machine as `make test` does on a CPU one.
"""

import os

import pytest

OPTIONAL = ("simpy", "nvtx", "matplotlib", "pandas", "pydantic")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


class _GuardedModule(pytest.Module):
    """A test module whose import fails only for want of an optional package skips, with the reason."""

    def _getobj(self):
        try:
            return super()._getobj()
        except self.CollectError as exc:
            text = str(exc)
            for name in OPTIONAL:
                if f"No module named '{name}'" in text:
                    pytest.skip(f"needs the optional package {name!r}, not installed here", allow_module_level=True)
            raise


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name == "__init__.py":
        return None
    return _GuardedModule.from_parent(parent, path=module_path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that imports an optional package inside its body, where it is missing, is reported as
    skipped with the reason rather than failed."""
    outcome = yield
    rep = outcome.get_result()
    exc = call.excinfo
    if exc is not None and exc.errisinstance(ModuleNotFoundError):
        name = (getattr(exc.value, "name", "") or "").split(".")[0]
        if name in OPTIONAL:
            rep.outcome = "skipped"
            rep.longrepr = (str(item.path), (item.location[1] or 0) + 1,
                            f"Skipped: needs the optional package {name!r}, not installed here")
