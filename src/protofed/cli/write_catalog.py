"""`python -m protofed.cli.write_catalog`: regenerate `catalog.json`, the built-in lines of
`protofed list`, from the registries.

Run it after adding, removing or re-describing an algorithm, data set, partitioner or model,
and commit the file: `protofed list` reads it instead of importing every registry (and
torch), and a test fails while it differs from what the registries list.
"""

from __future__ import annotations

from protofed.cli.catalog import write_builtin_catalog

if __name__ == "__main__":
    print(f"wrote {write_builtin_catalog()}")
