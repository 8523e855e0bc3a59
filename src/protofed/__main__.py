"""`python -m protofed ...`: the CLI without the installed entry point (e.g. PYTHONPATH=src)."""

from protofed.cli import app

app(prog_name="protofed")
