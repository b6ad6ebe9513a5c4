"""Device checks of the kernels and the engine, kept beside the product (see README.md).

Not installed: pyproject.toml's package search includes only ddbench*, kernels* and sim*. Run from the
repository root: `PYTHONPATH=. python3 -m devtools.<script> ...`.
"""
