"""kvops: keep LLM serving engines inside their GPU memory, from the KV-cache formula up."""

__version__ = "0.1.0"
