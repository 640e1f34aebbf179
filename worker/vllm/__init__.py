"""worker.vllm."""
