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
        return _probing(faiss.index_cpu_to_all_gpus(idx, co, ngpu=n_gpu), idx, index.nprobe)
    if index._gpu_resources is None:
        index._gpu_resources = [faiss.StandardGpuResources() for _ in range(n_gpu)]
    n = len(index._codes[side].codes)
    shards = faiss.IndexShards(idx.d, True, False)   # threaded; each shard keeps its ids
    shards.own_indices = True
    for g in range(n_gpu):
        part = faiss.clone_index(idx)   # trained, its lists empty
        index._codes[side].fill(part, np.arange(g * n // n_gpu, (g + 1) * n // n_gpu))
        shards.add_shard(faiss.index_cpu_to_gpu(index._gpu_resources[g], g, part, co))
        del part
    return _probing(shards, idx, index.nprobe)


def _probing(gpu_index: faiss.Index, cpu_index: faiss.Index, nprobe: int) -> faiss.Index:
    """`gpu_index` (a copy of `cpu_index`) probing `nprobe` lists. Not `extract_index_ivf(...).nprobe`: faiss's IVF extraction
    (faiss/IVFlib.cpp) knows the CPU `IndexIVF` classes only, and a GPU IVF is none of them. faiss's
    `GpuParameterSpace.set_index_parameter` (faiss/gpu/GpuAutoTune.cpp) sets it on a `GpuIndexIVF`, through
    the `IndexPreTransform` of OPQ and the shards (`ParameterSpace`, faiss/AutoTune.cpp); an index with
    no IVF inside has no nprobe to set."""
    if faiss.try_extract_index_ivf(cpu_index) is not None:
        faiss.GpuParameterSpace().set_index_parameter(gpu_index, "nprobe", nprobe)
    return gpu_index
