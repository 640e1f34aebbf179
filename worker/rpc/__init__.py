"""worker.rpc."""
