"""The one exception type for errors a user can cause.

The CLI catches it, prints its message on one line and exits with status 2.
"""


class DDBenchError(Exception):
    """Bad input from a user: unknown name, bad number, malformed file, no GPU."""


def unknown(kind: str, name: str, known) -> DDBenchError:
    """Error for an unknown catalog name, listing the known ones."""
    return DDBenchError(f"unknown {kind} '{name}'; known: {', '.join(sorted(known))}")
