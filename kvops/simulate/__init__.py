"""`kvops simulate`: a request trace replayed through vLLM's own scheduler under a GPU step-time model."""
