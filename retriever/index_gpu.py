"""A phrase index searched on GPUs: one side's index across every GPU faiss sees."""
from __future__ import annotations

import faiss
import numpy as np


def on_gpus(index, side: str) -> faiss.Index:
    """One side's index across every GPU faiss sees, one shard of the vectors each (IndexShards),
    with float16 lookup tables (8-bit PQ codes of 56 bytes and more need them on faiss's GPU, and
    they halve the tables' shared memory for any size). A shard is filled on the CPU from the
    codes, copied to its GPU and dropped, so the CPU holds one shard at a time, never the index."""
    idx, n_gpu = index._faiss[side], faiss.get_num_gpus()
    co = faiss.GpuMultipleClonerOptions()
    co.useFloat16LookupTables = True
    if side not in index._from_codes:   # Flat, or an IVF that holds its lists: faiss shards it
        co.shard = True
        return faiss.index_cpu_to_all_gpus(idx, co, ngpu=n_gpu)
    if index._gpu_resources is None:
        index._gpu_resources = [faiss.StandardGpuResources() for _ in range(n_gpu)]
    n = len(index._codes[side].codes)
    shards = faiss.IndexShards(idx.d, True, False)   # threaded; each shard keeps its ids
    shards.own_indices = True
    for g in range(n_gpu):
        part = faiss.clone_index(idx)   # trained, its lists empty
        index._codes[side].fill(part, np.arange(g * n // n_gpu, (g + 1) * n // n_gpu))
        gpu = faiss.index_cpu_to_gpu(index._gpu_resources[g], g, part, co)
        faiss.extract_index_ivf(gpu).nprobe = index.nprobe
        shards.add_shard(gpu)
        del part
    return shards
