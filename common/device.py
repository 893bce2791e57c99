"""Where models run, and in what precision at search time: the one place that decides."""
from __future__ import annotations

import os
from functools import lru_cache

from odqa.common.io import InputError


def pick_device(device: str | None = None) -> str:
    """`device` when given, else "cuda" when torch sees a GPU, else "cpu"."""
    import torch  # here, not at the top: odqa.common loads without torch
    if device:
        try:
            kind = torch.device(device).type
        except (RuntimeError, TypeError):
            raise InputError(f"device {device!r} is not a torch device (cpu, cuda, cuda:N, mps)") from None
        if kind == "cuda" and not torch.cuda.is_available():
            raise InputError(f"device {device!r}: torch sees no CUDA GPU here (torch {torch.__version__}; "
                             "a CPU build has none)")
        return str(device)
    return "cuda" if torch.cuda.is_available() else "cpu"


def search_dtype(device: str):
    """The dtype question encoders (and the dense retriever's passage encoder) run in, and the reader
    reads in (under autocast): bfloat16 where the hardware computes it natively (a CUDA GPU that
    supports it; a CPU with AVX512-BF16 or AMX), else float32. On the 2-core AVX512-BF16 CPU here a
    MiniLM encodes questions 1.8x faster in bfloat16, their vectors at cosine 0.99996 to float32's
    (docs/notes/retrieval.md), and the FiD reader reads 1.7x faster with EM within a question
    (docs/notes/reader.md). ODQA_SEARCH_DTYPE=float32 or bfloat16 overrides the choice."""
    import torch
    choice = os.environ.get("ODQA_SEARCH_DTYPE", "auto")
    if choice not in ("auto", "float32", "bfloat16"):
        raise InputError(f"ODQA_SEARCH_DTYPE must be auto, float32 or bfloat16, not {choice!r}")
    if choice != "auto":
        return getattr(torch, choice)
    if str(device).startswith("cuda"):
        # native only: torch's default (including_emulation=True) says yes on a V100 or a T4, which make
        # bfloat16 tensors but compute them emulated, slower than float32 (torch/cuda/__init__.py)
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float32
    return torch.bfloat16 if str(device) == "cpu" and cpu_has_bf16() else torch.float32


@lru_cache(maxsize=1)   # the reader asks at every read, `serve` at every request; the CPU does not change
def cpu_has_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:   # not Linux: no way to tell here, float32 is always right
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@lru_cache(maxsize=1)   # once a process: every command and every pipeline load asks
def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed blocks for reuse instead of handing each large one back to the
    system. By default a block over its threshold (at most 32 MB) is mmap-ed fresh at every allocation
    and unmapped at its free, so every activation of a batch of passages page-faults its memory in again:
    reading 8 questions at k = 10, GELU took 24 ms a layer against 8 with the memory kept, and the
    encoder 1.3x as long (docs/notes/serving.md). The usual advice for PyTorch on CPU (jemalloc or
    tcmalloc in LD_PRELOAD) does the same; this needs no other library. The process's RSS stays at its
    peak, since that peak recurs. ODQA_KEEP_FREED_MEMORY=0 leaves malloc as it is. True when set; a
    no-op off glibc."""
    if os.environ.get("ODQA_KEEP_FREED_MEMORY", "1") == "0":
        return False
    import ctypes
    try:
        libc = ctypes.CDLL(None)   # the process's own symbols, libc's among them (find_library runs ldconfig)
    except (OSError, TypeError):   # TypeError: Windows loads no library by None
        return False
    if not hasattr(libc, "gnu_get_libc_version"):   # glibc's own; musl and macOS have other allocators
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    # a glibc that bounds the threshold by its heaps' size (64 MB) refuses 1 GB; 32 MB covers a batch's
    # bfloat16 activations
    if not any(libc.mallopt(m_mmap_threshold, most) for most in (1 << 30, 32 << 20)):
        return False
    return bool(libc.mallopt(m_trim_threshold, 1 << 30))
