"""The tools that run the whole system: the engine simulator, `boomerang up`, the demo, replay and the benchmark."""
