"""Where models run: the one place that decides between CUDA and the CPU."""
from __future__ import annotations


def pick_device(device: str | None = None) -> str:
    """`device` when given, else "cuda" when torch sees a GPU, else "cpu"."""
    if device:
        return str(device)
    import torch  # here, not at the top: odqa.common loads without torch
    return "cuda" if torch.cuda.is_available() else "cpu"
