"""`python -m protofed.cli ...`: the CLI without the installed entry point."""

from protofed.cli import main

main()
