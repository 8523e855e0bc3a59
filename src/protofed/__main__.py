"""`python -m protofed ...`: the CLI without the installed entry point (e.g. PYTHONPATH=src)."""

from protofed.cli import main

main()
