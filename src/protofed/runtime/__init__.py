"""The built-in engine: seeding, local training, client context, simulation, workers."""
