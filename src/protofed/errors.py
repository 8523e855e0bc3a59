"""User-facing errors.

Anything the user can fix (a config key, a file path, a shape) raises `ConfigError`; the CLI
prints its message on one line and exits with code 2. Everything else is a bug and keeps its
traceback.
"""


class ConfigError(ValueError):
    """A problem in the user's input: config, data file, or command line."""


class RunStopped(RuntimeError):
    """A run that cannot go on for a reason outside protofed's code: a Flower round without
    enough replies, nodes that are gone. The CLI prints it on one line (exit code 2)."""


class RunComplete(ConfigError):
    """A resume found the run complete: another process finished it in the meantime. The
    CLI and `protofed.resume` treat it as a finished run, not as an error."""
