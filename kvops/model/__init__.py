"""Model specs: what a model's KV cache is made of, read once from its config.json."""

from kvops.model.locate import load_model
from kvops.model.spec import FullAttention, LayerGroup, ModelSpec, MultiLatentAttention, SlidingWindow

__all__ = ["FullAttention", "LayerGroup", "ModelSpec", "MultiLatentAttention", "SlidingWindow", "load_model"]
