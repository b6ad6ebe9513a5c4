"""Case-insensitive lookup of a catalog name, through its aliases."""

from __future__ import annotations

from ddbench.core.errors import unknown


def lookup(kind: str, name: str, table: dict, aliases: dict):
    """table[name], matching case-insensitively and through `aliases`; else a DDBenchError listing the names."""
    key = name.lower()
    key = aliases.get(key, key)
    if key not in table:
        raise unknown(kind, name, table)
    return table[key]
