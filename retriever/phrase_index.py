"""`odqa build-index`: merge phrase dump shards into one index directory.

    start.faiss, end.faiss   MIPS indexes over start and end vectors (faiss `index_factory` string:
                             "Flat" exact; "IVF4096,SQ4" or "OPQ96,IVF4096,PQ96" compressed, trained on
                             a sample, filled in chunks; nprobe is set at search time)
    meta.npz                 vector id -> passage row, token index, character start/end

Search reads vectors back from the faiss indexes themselves (exact for Flat, decoded from the codes for
SQ/PQ) to rescore hits and find the best end (start) within L tokens of a start (end) hit, so a
compressed index is all that is kept: no float copy of the vectors beside it.
    manifest.json            encoder hash, factory string, counts, corpus fingerprint

Vectors of one passage are contiguous and in token order; `passage_first[row]`/`passage_count[row]`
give each passage's slice. The directory is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from common.corpus import corpus_info
from common.io import InputError, atomic_path, read_json, write_json

log = logging.getLogger(__name__)
MANIFEST_VERSION = 1


def _load_shards(dump_dir: Path) -> tuple[list[Path], dict]:
    shards = sorted(p for p in dump_dir.glob("shard-*-of-*") if p.is_dir())
    if not shards:
        raise InputError(f"{dump_dir}: no phrase dump shards (run `odqa dump-phrases` first)")
    summaries = []
    for s in shards:
        if not (s / "done.json").exists():
            raise InputError(f"{s} is not complete: run its `odqa dump-phrases --shard` again to finish it")
        summaries.append(read_json(s / "done.json"))
    n = {tuple(x["shard"])[1] for x in summaries}
    keys = {(x["encoder_hash"], x["fingerprint"], x["dim"], x["max_span_len"]) for x in summaries}
    if len(n) != 1 or len(shards) != n.pop() or len(keys) != 1:
        raise InputError(f"{dump_dir}: shards are missing or were made with different encoders or corpora")
    return shards, summaries[0]


def build_index(dump_dir: str | os.PathLike, out_dir: str | os.PathLike, corpus_dir: str | os.PathLike,
                factory: str = "Flat", train_size: int = 200_000, add_chunk: int = 100_000, seed: int = 0) -> dict:
    dump_dir, out_dir = Path(dump_dir), Path(out_dir)
    shards, first = _load_shards(dump_dir)
    info = corpus_info(corpus_dir)
    if first["fingerprint"] != info["fingerprint"]:
        raise InputError(f"{dump_dir} was dumped from another version of {corpus_dir}")
    chunks = [c for s in shards for c in sorted(s.glob("chunk-*.npz"))]
    arrays = {k: [] for k in ("start", "end", "passage_row", "token", "char_start", "char_end")}
    for c in tqdm(chunks, desc="merge dump", disable=None):
        z = np.load(c)
        for k in arrays:
            arrays[k].append(z[k])
    merged = {k: np.concatenate(v) for k, v in arrays.items()}
    order = np.lexsort((merged["token"], merged["passage_row"]))  # passages in corpus order, tokens in order
    merged = {k: v[order] for k, v in merged.items()}
    n_vec, dim = merged["start"].shape
    n_pass = info["passages"]
    counts = np.bincount(merged["passage_row"], minlength=n_pass).astype(np.int64)
    first_idx = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)

    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        for side in ("start", "end"):
            index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:
                rng = np.random.default_rng(seed)
                sample = merged[side][rng.choice(n_vec, min(train_size, n_vec), replace=False)].astype(np.float32)
                log.info("training %s index (%s) on %d vectors", side, factory, len(sample))
                index.train(sample)
            for a in range(0, n_vec, add_chunk):
                index.add(merged[side][a:a + add_chunk].astype(np.float32))
            faiss.write_index(index, str(tmp / f"{side}.faiss"))
        with open(tmp / "meta.npz", "wb") as f:
            np.savez(f, passage_first=first_idx, passage_count=counts,
                     **{k: v for k, v in merged.items() if k not in ("start", "end")})
        manifest = {"version": MANIFEST_VERSION, "encoder_hash": first["encoder_hash"], "factory": factory,
                    "vectors": int(n_vec), "passages": int(n_pass), "dim": int(dim),
                    "max_span_len": first["max_span_len"], "fingerprint": info["fingerprint"],
                    "vectors_per_passage": n_vec / max(n_pass, 1)}
        write_json(tmp / "manifest.json", manifest)
    sizes = {p.name: p.stat().st_size for p in out_dir.iterdir()}
    manifest["bytes"] = sizes
    write_json(out_dir / "manifest.json", manifest)
    log.info("phrase index %s: %d vectors (%.1f per passage), %s", out_dir, n_vec, manifest["vectors_per_passage"], sizes)
    return manifest
