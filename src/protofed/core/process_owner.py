"""Who owns this process: protofed's command line, or a caller's program.

The command line owns its process and may end it (a Flower session stuck after Ctrl-C
exits with 130, flower/session.py `StopDeadline`). Under the Python API the process is the
caller's (a notebook's kernel, a larger program): protofed then ends only the processes it
started itself, and never the process.
"""

from __future__ import annotations

_CLI = [False]


def claim_for_cli() -> None:
    """Called once by the `protofed` entry point, before any command runs."""
    _CLI[0] = True


def cli_owns_process() -> bool:
    """Whether protofed's command line runs this process (else: the caller's program)."""
    return _CLI[0]
