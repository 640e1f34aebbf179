"""worker.engine.engine."""
