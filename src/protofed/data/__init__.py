"""Data: loaders (one per source), partitioners, and per-client splits."""
