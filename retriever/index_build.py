"""`odqa build-index`: merge phrase dump shards into one index directory (its files: retriever/phrase_index.py).

The quantisers train on a sample (OPQ, the coarse centroids and the PQ codebooks; the coarse k-means on
every GPU faiss sees), and the kept vectors are encoded chunk by chunk into the codes files, a share of
the chunks a rank under a launcher; rank 0 writes the rest. The directory is written under a temporary
name and renamed when complete.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from odqa.common.artifact import build_dir, fingerprint
from odqa.common.corpus import corpus_info
from odqa.common.io import InputError, atomic_path, glob_escape, read_json
from odqa.common.paths import default_corpus
from odqa.common.ranks import current
from odqa.common.settings import needs
from odqa.retriever.args import BuildIndexArgs
from odqa.retriever.ivfpq_codes import IVFPQCodes, narrow, position_type
from odqa.retriever.phrase_dump import dump_chunks, read_chunk
from odqa.retriever.phrase_filter import chunk_scores, filter_dir, fitted_filter, saved_scores
from odqa.retriever.phrase_index import MANIFEST_VERSION, SIDES

log = logging.getLogger(__name__)


def default_factory(n_vectors: int, dim: int) -> str:
    """OPQ + IVF-PQ sized to the index: about sqrt(n)/2 coarse lists (a power of two, 16 to 65,536), few
    enough that their centroids stay a small part of the bytes, and 8-bit PQ over sub-vectors of about 12
    dimensions (16 bytes for a 192-d vector), behind OPQ's rotation, which balances the variance across
    the sub-vectors (DensePhrases' OPQ96; on the full phrase model 3.3 points of Top-5 over plain PQ at
    the same bytes, docs/notes/retrieval.md). Below 4,096 vectors there is too little to train the quantisers
    on, and an exact scan costs nothing: Flat."""
    if n_vectors < 4096:
        return "Flat"
    nlist = int(min(65536, max(16, 2 ** round(math.log2(math.sqrt(n_vectors) / 2)))))
    m = max(d for d in range(1, max(1, dim // 12) + 1) if dim % d == 0)
    return f"OPQ{m},IVF{nlist},PQ{m}"


def build_index(args: BuildIndexArgs, add_chunk: int = 100_000) -> dict:
    """`odqa build-index`: the index of `args.dump`'s vectors in `args.out`. `keep` < 1 indexes only that
    share of the dump's tokens, those the phrase filter (`odqa train-filter`, by default DUMP/filter)
    scores highest, or with `model_filter` those the phrase model's own filter head scored highest as it
    dumped them (DensePhrases' filter); `factory` None: `default_factory`.

    The dump is read a chunk at a time (21M passages dump to terabytes): once for the filter's scores
    and where each kept vector goes, once for the quantisers' training sample, once to fill the index.
    Memory holds the metadata and one score a dumped token, not the dump. An 8-bit IVF-PQ (the default)
    is encoded chunk by chunk into its codes file, written in place through a memory map, so neither
    faiss's lists nor the codes are held; any other IVF index is filled chunk by chunk under each
    vector's id; any other index (Flat, HNSW) is filled in id order from the kept vectors gathered first."""
    needs(args, "dump", "out")
    dump_dir, out_dir = Path(args.dump), Path(args.out)
    corpus_dir = args.corpus or default_corpus()
    factory, keep, filter_path, model_filter = args.factory, args.keep, args.filter, args.model_filter
    train_size, seed = args.train_size, args.seed
    chunks, first = dump_chunks(dump_dir, corpus_dir)
    n_pass, dim = corpus_info(corpus_dir)["passages"], first["dim"]
    if not 0 < keep <= 1:
        raise InputError(f"--keep is a share of tokens in (0, 1], not {keep}")
    if factory is not None:   # a bad factory string is refused before the dump is read, not after
        try:
            faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise InputError(f"--factory {factory!r}: faiss cannot make this index ({str(e).strip().splitlines()[-1]})") from None
    if model_filter and filter_path is not None:
        raise InputError("--model-filter ranks tokens by the phrase model's filter head, --filter by a fitted "
                         "filter: give one")
    kept, threshold = _kept_tokens(chunks, keep, "model" if model_filter else filter_path or filter_dir(dump_dir),
                                   first["encoder_hash"])
    ids, meta, counts = _placed(chunks, kept, n_pass)
    n_vec = len(meta["token"])
    factory = factory or default_factory(n_vec, dim)
    # A model whose start and end vectors are one (DensePhrases' "full" head) dumps one side: it is
    # indexed once and searched by both the start and the end query.
    sides = ("start",) if first.get("shared_sides") else SIDES

    key = {"corpus": first["fingerprint"], "encoder_hash": first["encoder_hash"], "factory": factory, "keep": keep,
           "filter_threshold": threshold, "train_size": train_size, "seed": seed,
           **({"filter": "the phrase model's"} if model_filter else {})}
    # Under a launcher rank 0 trains the start side and rank 1 the end side (each on its own sample's
    # side: the same vectors a single process trains on), and every rank encodes its share of the
    # chunks into the codes files. The trained quantisers, the codes files and a mark for each chunk
    # encoded stay in a work directory beside the index, named for the build's inputs and settings, so
    # that a killed build resumes where it stopped with the same quantisers (the same codes as a build
    # never stopped); it goes once the index is in place. Rank 0 writes the index.
    ranks = current()
    work = out_dir.with_name(f".{out_dir.name}.build-{fingerprint(key)}")
    if ranks.main:
        for other in out_dir.parent.glob(f".{glob_escape(out_dir.name)}.build-*"):
            if other != work:   # a build of other inputs or settings, never to be resumed now
                shutil.rmtree(other, ignore_errors=True)
        (work / "done").mkdir(parents=True, exist_ok=True)
        if any((work / "done").iterdir()):
            log.info("%s: resuming the build stopped there", work)
    ranks.barrier()   # before any rank writes its trained side there
    with build_dir(out_dir, key) if ranks.main else contextlib.nullcontext((None, None)) as (tmp, manifest):
        indexes = _trained(sides, dim, factory, work, ranks, lambda mine: _gathered(
            chunks, kept, ids, np.random.default_rng(seed).choice(n_vec, min(train_size, n_vec), replace=False),
            dim, "sample", sides=mine), train_size=min(train_size, n_vec))
        if all(IVFPQCodes.encodes(index) for index in indexes.values()):
            # The default: each vector's list and code straight into the codes files (`sa_encode` gives
            # what `add` would store), never filling faiss's lists only to read the codes back out.
            _encode_codes(indexes, chunks, kept, ids, n_vec, add_chunk, work, ranks)
            if ranks.main:
                for side, index in indexes.items():
                    for name in (f"{side}.codes.npy", f"{side}.lists.npy"):
                        os.replace(work / name, tmp / name)
                    # the ids list by list, for whole-index search to read the codes a list at a time
                    lists = np.load(tmp / f"{side}.lists.npy", mmap_mode="r")
                    np.save(tmp / f"{side}.order.npy", IVFPQCodes.list_order(lists))
                    del lists
                    faiss.write_index(index, str(tmp / f"{side}.faiss"))   # what was trained; its lists empty
        if ranks.main:   # rank 0 alone fills any other kind of index, and writes the metadata
            if not all(IVFPQCodes.encodes(index) for index in indexes.values()):
                _fill_in_faiss(indexes, chunks, kept, ids, n_vec, dim, add_chunk, tmp)
            with open(tmp / "meta.npz", "wb") as f:
                # Rows follow from the counts (vectors run in passage order); offsets fit 16 bits for passages
                # under 64k characters, tokens 8 bits under 256 tokens.
                titles = {"in_title": meta["in_title"]} if meta["in_title"].any() else {}
                np.savez_compressed(f, passage_count=counts.astype(np.int32), token=narrow(meta["token"]),
                                    char_start=narrow(meta["char_start"]), char_end=narrow(meta["char_end"]), **titles)
            sizes = {p.name: p.stat().st_size for p in tmp.iterdir()}
            manifest.update(version=MANIFEST_VERSION, encoder_hash=first["encoder_hash"], factory=factory, keep=keep,
                            filter_threshold=threshold, vectors=int(n_vec), passages=int(n_pass), dim=int(dim),
                            max_span_len=first["max_span_len"], fingerprint=first["fingerprint"],
                            vectors_per_passage=n_vec / max(n_pass, 1), sides=list(sides), bytes=sizes,
                            bytes_per_passage=sum(sizes.values()) / max(n_pass, 1))
    ranks.barrier()   # the index is in place before any rank goes on
    if ranks.main:
        shutil.rmtree(work)
    if not ranks.main:
        manifest = read_json(out_dir / "manifest.json")
    log.info("phrase index %s: %d vectors (%.1f per passage), %.0f bytes per passage", out_dir, n_vec,
             manifest["vectors_per_passage"], manifest["bytes_per_passage"])
    return manifest


def _trained(sides, dim: int, factory: str, work: Path, ranks, sample, train_size: int) -> dict[str, faiss.Index]:
    """Each side's index, trained: read from WORK/SIDE.faiss where an earlier run of this build trained it,
    else trained here, rank r training sides r, r + world, ... on `sample(its sides)` and saving them
    there for the other ranks and for a resumed run."""
    indexes = {side: faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT) for side in sides}
    if indexes["start"].is_trained:   # Flat: nothing to train
        return indexes
    mine = [side for i, side in enumerate(indexes) if i % ranks.world == ranks.rank
            and not (work / f"{side}.faiss").exists()]
    for index in indexes.values():
        ivf = faiss.try_extract_index_ivf(index)
        if isinstance(faiss.downcast_index(ivf) if ivf is not None else None, faiss.IndexIVFPQ):
            # faiss reorders each PQ codebook for Hamming-distance filtering unless told not to; search
            # here never filters (polysemous_ht stays 0), and the reordering is a quarter of the training
            faiss.downcast_index(ivf).do_polysemous_training = False
    if mine:
        vectors = sample(mine)
        for side in mine:
            log.info("training %s index (%s) on %d vectors", side, factory, train_size)
            _train(indexes[side], vectors.pop(side))
            with atomic_path(work / f"{side}.faiss") as path:
                faiss.write_index(indexes[side], str(path))
    ranks.barrier()   # every side is trained and saved before any rank encodes with them
    return {side: index if side in mine else faiss.read_index(str(work / f"{side}.faiss"))
            for side, index in indexes.items()}


def gpu_flat(d: int, every: bool) -> faiss.Index:
    """A flat L2 index on every GPU faiss sees (`every`), or on the first."""
    if every:
        return faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(d))
    resources = faiss.StandardGpuResources()
    flat = faiss.index_cpu_to_gpu(resources, 0, faiss.IndexFlatL2(d))
    flat.held_resources = resources   # the resources live as long as the index that uses them
    return flat


def _train(index: faiss.Index, sample: np.ndarray, flat=None) -> None:
    """`index.train` with its k-means assigning through `flat(d, every)` (default `gpu_flat` where faiss sees
    a GPU), as faiss's own GPU benchmarks train (faiss/benchs/bench_gpu_1bn.py): the coarse k-means through
    one over every GPU (`IndexIVF.clustering_index`), the PQ codebooks' (the IVF-PQ's, and OPQ's, which
    train through a `ProductQuantizer` too) through one of a sub-vector's width on one GPU
    (`ProductQuantizer.assign_index`, as faiss's `GpuIndexIVFPQ` trains its own). Without a GPU, faiss's
    CPU k-means. `flat` returning CPU indexes runs the same wiring on a CPU (scripts/gpu_check.py --cpu)."""
    if flat is None and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        flat = gpu_flat
    ivf = faiss.try_extract_index_ivf(index)
    if flat is None or ivf is None:
        index.train(sample)
        return
    ivfpq, opq = faiss.downcast_index(ivf), None
    held = [flat(ivf.d, True)]   # referenced until the training ends
    ivf.clustering_index = held[0]
    if isinstance(ivfpq, faiss.IndexIVFPQ):
        held.append(flat(ivfpq.pq.dsub, False))
        ivfpq.pq.assign_index = held[-1]
        outer = faiss.downcast_index(index)
        first = faiss.downcast_VectorTransform(outer.chain.at(0)) if isinstance(outer, faiss.IndexPreTransform) else None
        if isinstance(first, faiss.OPQMatrix) and first.M == ivfpq.pq.M and first.d_out == ivfpq.pq.d:
            opq, first.pq = first, ivfpq.pq   # OPQ's codebooks train through the same assign index
    try:
        index.train(sample)
    finally:   # the assign indexes are the training's, not the index's (they are not saved with it)
        ivf.clustering_index = None
        if isinstance(ivfpq, faiss.IndexIVFPQ):
            ivfpq.pq.assign_index = None
        if opq is not None:
            opq.pq = None


def _encode_codes(indexes: dict, chunks: list[Path], kept: list, ids: list, n_vec: int, add_chunk: int, work: Path,
                  ranks) -> None:
    """Each kept vector's IVF list and PQ code into WORK/SIDE.lists.npy and SIDE.codes.npy, at its id:
    rank r encodes chunks r, r + world, ..., and writes those rows alone, through a memory map."""
    nlist = faiss.extract_index_ivf(indexes["start"]).nlist
    list_type = narrow(np.array([nlist - 1])).dtype     # the narrowest that holds every list number
    if ranks.main:
        for side, index in indexes.items():
            shapes = {"codes": (np.uint8, (n_vec, IVFPQCodes.code_size(index))), "lists": (list_type, (n_vec,))}
            for name, (dtype, shape) in shapes.items():
                path = work / f"{side}.{name}.npy"
                if not _holds(path, dtype, shape):   # made by the run this one resumes, else made now
                    with atomic_path(path) as tmp:
                        np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape).flush()
    ranks.barrier()
    codes = {side: np.load(work / f"{side}.codes.npy", mmap_mode="r+") for side in indexes}
    lists = {side: np.load(work / f"{side}.lists.npy", mmap_mode="r+") for side in indexes}
    done = work / "done"
    todo = [i for i in range(ranks.rank, len(chunks), ranks.world) if not (done / str(i)).exists()]
    for i in tqdm(todo, desc="encode", disable=None):
        for side, x, at in _kept_batches([chunks[i]], [kept[i]], [ids[i]], add_chunk, tuple(indexes), bar=False):
            lists[side][at], codes[side][at] = IVFPQCodes.encode(indexes[side], x)
        for side in indexes:   # on disk before the chunk is marked done
            codes[side].flush()
            lists[side].flush()
        (done / str(i)).touch()
    del codes, lists
    ranks.barrier()


def _holds(path: Path, dtype, shape) -> bool:
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return array.dtype == dtype and array.shape == shape


def _fill_in_faiss(indexes: dict, chunks, kept, ids, n_vec: int, dim: int, add_chunk: int, tmp: Path) -> None:
    """Any index but an 8-bit IVF-PQ: an IVF filled chunk by chunk under each vector's id, any other (Flat,
    HNSW) in id order from the kept vectors gathered first."""
    if all(faiss.try_extract_index_ivf(index) is not None for index in indexes.values()):
        for side, x, at in _kept_batches(chunks, kept, ids, add_chunk, tuple(indexes)):
            indexes[side].add_with_ids(x, at.astype(np.int64))
    else:
        every = _gathered(chunks, kept, ids, np.arange(n_vec), dim, "gather", np.float16, tuple(indexes))
        for side, index in indexes.items():
            for a in tqdm(range(0, n_vec, add_chunk), desc=f"index {side}", disable=None):
                index.add(every[side][a:a + add_chunk].astype(np.float32))
        del every
    for side, index in indexes.items():
        faiss.write_index(index, str(tmp / f"{side}.faiss"))


def _kept_tokens(chunks: list[Path], keep: float, filter_path, encoder_hash: str) -> tuple[list[np.ndarray], float]:
    """Each chunk's mask of the tokens that a share `keep` of the whole dump keeps, those the filter
    scores highest (`filter_path` "model": the phrase model's filter logits in the dump), and the score
    threshold that does it."""
    sizes = [len(read_chunk(c, ("token",))["token"]) for c in chunks]
    if keep == 1:
        return [np.ones(n, bool) for n in sizes], float("-inf")
    if filter_path == "model":
        scores = [read_chunk(c, ("filter",))["filter"].astype(np.float32) for c in chunks]
        threshold = float(np.quantile(np.concatenate(scores), 1 - keep, overwrite_input=True))
        return [s >= threshold for s in scores], threshold
    model = fitted_filter(filter_path, encoder_hash)
    scores = saved_scores(filter_path, chunks, sizes)   # train-filter's, when it scored this dump
    scores = chunk_scores(model, chunks) if scores is None else [np.array(s) for s in scores]
    # partitioned in place: two floats a dumped token at the peak, not three (np.quantile copies its input)
    threshold = float(np.quantile(np.concatenate(scores), 1 - keep, overwrite_input=True))
    return [s >= threshold for s in scores], threshold


def _placed(chunks: list[Path], kept: list[np.ndarray], n_pass: int
            ) -> tuple[list[np.ndarray], dict[str, np.ndarray], np.ndarray]:
    """Each chunk's kept tokens' vector ids (passages in corpus order, tokens in order within one, as
    search needs them), the metadata in id order, and the kept tokens a passage. Every column is held
    as narrow as its values (rows and ids int32, offsets as the index stores them): about 20 bytes a
    kept vector where the dump's int64 and int32 columns took 42."""
    fields = ("passage_row", "token", "char_start", "char_end", "in_title")
    owner, counts = np.full(n_pass, -1, np.int32), np.zeros(n_pass, np.int64)
    parts = []
    for i, (c, mask) in enumerate(zip(chunks, kept)):
        raw = {k: v[mask] for k, v in read_chunk(c, fields).items()}
        rows, tokens = raw["passage_row"], raw["token"]
        ordered = np.all((np.diff(rows) > 0) | ((np.diff(rows) == 0) & (np.diff(tokens) > 0)))
        passages, n = np.unique(rows, return_counts=True)
        if not ordered or (owner[passages] >= 0).any():
            raise InputError(f"{c}: not a chunk of `odqa dump-phrases` (its passages must be whole, grouped, "
                             "in token order, and in no other chunk)")
        owner[passages], counts[passages] = i, n
        parts.append({"passage_row": rows.astype(position_type(n_pass)), "in_title": raw["in_title"],
                      **{k: narrow(raw[k]) for k in ("token", "char_start", "char_end")}})
    first_id = np.concatenate([[0], np.cumsum(counts)])
    n_vec = int(counts.sum())
    ids = []
    for part in parts:
        rows = part.pop("passage_row")   # its place in its passage, after the passages before it
        at = first_id[rows] + np.arange(len(rows)) - np.searchsorted(rows, rows)
        ids.append(at.astype(position_type(n_vec)))
    meta = {k: np.empty(n_vec, np.result_type(*(p[k].dtype for p in parts)) if parts else np.int32) for k in fields[1:]}
    for part, at in zip(parts, ids):
        for k in meta:
            meta[k][at] = part.pop(k)
    return ids, meta, counts


def _kept_batches(chunks: list[Path], kept: list[np.ndarray], ids: list[np.ndarray], size: int, sides=SIDES,
                  bar: bool = True) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(side, float32 vectors, their ids) of every kept vector of `sides`, a dump chunk and `size`
    vectors at a time, the start side before the end side in each chunk."""
    for i, c in enumerate(tqdm(chunks, desc="index", disable=None if bar else True)):
        vectors = read_chunk(c, sides)
        for side in sides:
            x = vectors[side][kept[i]]
            for a in range(0, len(x), size):
                yield side, x[a:a + size].astype(np.float32), ids[i][a:a + size]


def _gathered(chunks: list[Path], kept: list[np.ndarray], ids: list[np.ndarray], want: np.ndarray, dim: int,
              desc: str, dtype=np.float32, sides=SIDES) -> dict[str, np.ndarray]:
    """The start and end vectors (or the `sides` named) of the ids `want`, in that order."""
    out = {side: np.empty((len(want), dim), dtype) for side in sides}
    order = np.argsort(want, kind="stable")
    sorted_want = want[order]
    for i, c in enumerate(tqdm(chunks, desc=desc, disable=None)):
        at = np.searchsorted(sorted_want, ids[i])
        hit = at < len(want)
        hit[hit] = sorted_want[at[hit]] == ids[i][hit]
        if hit.any():
            vectors = read_chunk(c, tuple(sides))
            for side in out:
                out[side][order[at[hit]]] = vectors[side][kept[i]][hit]
    return out
