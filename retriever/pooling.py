"""Sentence vectors from token states as sentence-transformers' MiniLM was trained to give them:
mean of the unmasked tokens, L2-normalised (so inner product is cosine)."""
import torch


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    hidden = hidden.float()   # a bfloat16 encoder's states are summed in float32
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
    return torch.nn.functional.normalize(pooled, dim=-1)
