"""worker.kv_io."""
