"""protofed: personalized federated learning on heterogeneous real-world data."""

from protofed.api import Run, Summary, load_run, resolve_config, run

__version__ = "0.1.0"

__all__ = ["Run", "Summary", "__version__", "load_run", "resolve_config", "run"]
