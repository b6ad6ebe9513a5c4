"""Case-insensitive lookup of a catalog name, through its aliases."""

from __future__ import annotations

from ddbench.core.errors import unknown


def lookup(kind: str, name: str, table: dict, aliases: dict):
    """table[name], matching case-insensitively and through `aliases`; a name ending in .yaml, .yml or .json is
    a file of your own (ddbench.core.catalog.files), and a file's spec loaded earlier is found by its name;
    else a DDBenchError listing the names."""
    from ddbench.core.catalog import files
    if files.is_file_name(name):
        return files.load(kind, name, type(next(iter(table.values()))), table, aliases)
    key = name.lower()
    key = aliases.get(key, key)
    if key not in table:
        got = files.loaded(kind, key)
        if got is not None:
            return got
        exc = unknown(kind, name, table)
        raise type(exc)(f"{exc}; or a .yaml or .json file of your own {kind}")
    return table[key]
