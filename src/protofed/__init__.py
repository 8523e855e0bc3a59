"""protofed: personalized federated learning on heterogeneous real-world data."""

__version__ = "0.1.0"
