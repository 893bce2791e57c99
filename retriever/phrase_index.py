"""`odqa build-index`: merge phrase dump shards into one index directory.

    start.faiss, end.faiss   MIPS indexes over start and end vectors (faiss `index_factory` string:
                             "Flat" exact; "IVF4096,SQ4" or "OPQ96,IVF4096,PQ96" compressed, trained on
                             a sample, filled in chunks; nprobe is set at search time)
    start.codes.npy, ...     for an 8-bit IVF-PQ (the default): the .faiss file holds only what was
    start.lists.npy, ...     trained (OPQ, coarse centroids, PQ codebooks), and the codes are stored in
    start.order.npy, ...     vector-id order with each vector's IVF list, encoded by faiss
                             (`sa_encode`) and written straight to the file, and the ids grouped by
                             list (order). Search reads them memory-mapped: by id behind the
                             pre-filter, list by list over the whole index; faiss's lists are built
                             only on GPUs, a shard a GPU. faiss would store an 8-byte id beside each
                             16-byte code, and an id here is only a position.
    meta.npz                 vector id -> passage row, token index, character start/end

Search reads vectors back from the faiss indexes themselves (exact for Flat, decoded from the codes for
SQ/PQ) to rescore hits and find the best end (start) within L tokens of a start (end) hit, so a
compressed index is all that is kept: no float copy of the vectors beside it.
    manifest.json            encoder hash, factory string, counts, corpus fingerprint

Vectors of one passage are contiguous and in token order; `passage_count[row]` (and its running sum)
give each passage's slice. The directory is written under a temporary name and renamed when complete.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
from tqdm import tqdm

from odqa.common.artifact import build_dir, fingerprint
from odqa.common.corpus import corpus_info
from odqa.common.io import InputError, check_checksums, loading, read_json
from odqa.common.ranks import current
from odqa.retriever.phrase_dump import dump_chunks, read_chunk
from odqa.retriever.phrase_filter import chunk_scores, filter_dir, fitted_filter, saved_scores

log = logging.getLogger(__name__)
MANIFEST_VERSION = 3   # 3: IVF-PQ codes beside the .faiss files, not inside them (2 still opens)
SIDES = ("start", "end")


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


def build_index(dump_dir: str | os.PathLike, out_dir: str | os.PathLike, corpus_dir: str | os.PathLike,
                factory: str | None = "Flat", keep: float = 1.0, filter_path: str | os.PathLike | None = None,
                model_filter: bool = False, train_size: int = 200_000, add_chunk: int = 100_000, seed: int = 0) -> dict:
    """`keep` < 1 indexes only that share of the dump's tokens, those the phrase filter
    (`odqa train-filter`, by default DUMP/filter) scores highest, or with `model_filter` those the phrase
    model's own filter head scored highest as it dumped them (DensePhrases' filter); `factory` None:
    `default_factory`.

    The dump is read a chunk at a time (21M passages dump to terabytes): once for the filter's scores
    and where each kept vector goes, once for the quantisers' training sample, once to fill the index.
    Memory holds the metadata and one score a dumped token, not the dump. An 8-bit IVF-PQ (the default)
    is encoded chunk by chunk into its codes file, written in place through a memory map, so neither
    faiss's lists nor the codes are held; any other IVF index is filled chunk by chunk under each
    vector's id; any other index (Flat, HNSW) is filled in id order from the kept vectors gathered first."""
    dump_dir, out_dir = Path(dump_dir), Path(out_dir)
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
    # chunks into the codes files, beside the index until it is complete (the other ranks never see its
    # temporary directory); rank 0 writes the index.
    ranks = current()
    shared = out_dir.with_name(f".{out_dir.name}.ranks-{fingerprint(key)}") if ranks.world > 1 else None
    if shared is not None:
        if ranks.main:
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir(parents=True)
        ranks.barrier()   # before any rank writes its trained side there
    with build_dir(out_dir, key) if ranks.main else contextlib.nullcontext((None, None)) as (tmp, manifest):
        work = shared or tmp
        indexes = {side: faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT) for side in sides}
        for index in indexes.values():
            ivf = faiss.try_extract_index_ivf(index)
            if isinstance(faiss.downcast_index(ivf) if ivf is not None else None, faiss.IndexIVFPQ):
                # faiss reorders each PQ codebook for Hamming-distance filtering unless told not to; search
                # here never filters (polysemous_ht stays 0), and the reordering is a quarter of the training
                faiss.downcast_index(ivf).do_polysemous_training = False
        mine = [side for i, side in enumerate(indexes) if i % ranks.world == ranks.rank]
        if not indexes["start"].is_trained and mine:
            pick = np.random.default_rng(seed).choice(n_vec, min(train_size, n_vec), replace=False)
            sample = _gathered(chunks, kept, ids, pick, dim, "sample", sides=mine)
            for side in mine:
                log.info("training %s index (%s) on %d vectors", side, factory, len(pick))
                _train(indexes[side], sample.pop(side))
        if shared is not None:   # every rank encodes with the same quantisers
            for side in mine:
                faiss.write_index(indexes[side], str(shared / f"{side}.faiss"))
            ranks.barrier()
            indexes = {side: index if side in mine else faiss.read_index(str(shared / f"{side}.faiss"))
                       for side, index in indexes.items()}
        if all(IVFPQCodes.encodes(index) for index in indexes.values()):
            # The default: each vector's list and code straight into the codes files (`sa_encode` gives
            # what `add` would store), never filling faiss's lists only to read the codes back out.
            _encode_codes(indexes, chunks, kept, ids, n_vec, add_chunk, work, ranks)
            if ranks.main:
                for side, index in indexes.items():
                    if shared is not None:
                        for name in (f"{side}.codes.npy", f"{side}.lists.npy"):
                            os.replace(shared / name, tmp / name)
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
                np.savez_compressed(f, passage_count=counts.astype(np.int32), token=_narrow(meta["token"]),
                                    char_start=_narrow(meta["char_start"]), char_end=_narrow(meta["char_end"]), **titles)
            sizes = {p.name: p.stat().st_size for p in tmp.iterdir()}
            manifest.update(version=MANIFEST_VERSION, encoder_hash=first["encoder_hash"], factory=factory, keep=keep,
                            filter_threshold=threshold, vectors=int(n_vec), passages=int(n_pass), dim=int(dim),
                            max_span_len=first["max_span_len"], fingerprint=first["fingerprint"],
                            vectors_per_passage=n_vec / max(n_pass, 1), sides=list(sides), bytes=sizes,
                            bytes_per_passage=sum(sizes.values()) / max(n_pass, 1))
    if shared is not None:
        ranks.barrier()   # the index is in place before any rank goes on
        if ranks.main:
            shutil.rmtree(shared)
        manifest = read_json(out_dir / "manifest.json")
    log.info("phrase index %s: %d vectors (%.1f per passage), %.0f bytes per passage", out_dir, n_vec,
             manifest["vectors_per_passage"], manifest["bytes_per_passage"])
    return manifest


def _train(index: faiss.Index, sample: np.ndarray) -> None:
    """`index.train`, its coarse k-means on every GPU faiss sees (the bulk of an IVF's training at
    65,536 lists), as faiss's own benchmarks do it; on the CPU otherwise."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None and hasattr(faiss, "index_cpu_to_all_gpus") and faiss.get_num_gpus() > 0:
        ivf.clustering_index = faiss.index_cpu_to_all_gpus(faiss.IndexFlatL2(ivf.d))
    index.train(sample)


def _encode_codes(indexes: dict, chunks: list[Path], kept: list, ids: list, n_vec: int, add_chunk: int, work: Path,
                  ranks) -> None:
    """Each kept vector's IVF list and PQ code into WORK/SIDE.lists.npy and SIDE.codes.npy, at its id:
    rank r encodes chunks r, r + world, ..., and writes those rows alone, through a memory map."""
    nlist = faiss.extract_index_ivf(indexes["start"]).nlist
    list_type = _narrow(np.array([nlist - 1])).dtype     # the narrowest that holds every list number
    if ranks.main:
        for side, index in indexes.items():
            np.lib.format.open_memmap(work / f"{side}.codes.npy", mode="w+", dtype=np.uint8,
                                      shape=(n_vec, IVFPQCodes.code_size(index))).flush()
            np.lib.format.open_memmap(work / f"{side}.lists.npy", mode="w+", dtype=list_type, shape=(n_vec,)).flush()
    ranks.barrier()
    codes = {side: np.load(work / f"{side}.codes.npy", mmap_mode="r+") for side in indexes}
    lists = {side: np.load(work / f"{side}.lists.npy", mmap_mode="r+") for side in indexes}
    mine = slice(ranks.rank, None, ranks.world)
    for side, x, at in _kept_batches(chunks[mine], kept[mine], ids[mine], add_chunk, tuple(indexes)):
        lists[side][at], codes[side][at] = IVFPQCodes.encode(indexes[side], x)
    for side in indexes:
        codes[side].flush()
        lists[side].flush()
    del codes, lists
    ranks.barrier()


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
        parts.append({"passage_row": rows.astype(_position_type(n_pass)), "in_title": raw["in_title"],
                      **{k: _narrow(raw[k]) for k in ("token", "char_start", "char_end")}})
    first_id = np.concatenate([[0], np.cumsum(counts)])
    n_vec = int(counts.sum())
    ids = []
    for part in parts:
        rows = part.pop("passage_row")   # its place in its passage, after the passages before it
        at = first_id[rows] + np.arange(len(rows)) - np.searchsorted(rows, rows)
        ids.append(at.astype(_position_type(n_vec)))
    meta = {k: np.empty(n_vec, np.result_type(*(p[k].dtype for p in parts)) if parts else np.int32) for k in fields[1:]}
    for part, at in zip(parts, ids):
        for k in meta:
            meta[k][at] = part.pop(k)
    return ids, meta, counts


def _kept_batches(chunks: list[Path], kept: list[np.ndarray], ids: list[np.ndarray], size: int, sides=SIDES
                  ) -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """(side, float32 vectors, their ids) of every kept vector of `sides`, a dump chunk and `size`
    vectors at a time, the start side before the end side in each chunk."""
    for i, c in enumerate(tqdm(chunks, desc="index", disable=None)):
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


def _position_type(n: int) -> type:
    """int32 for positions below n where it holds them all: 4 bytes a vector fewer than int64."""
    return np.int32 if n < 2**31 else np.int64


def _narrow(a: np.ndarray) -> np.ndarray:
    for t in (np.uint8, np.uint16, np.uint32):
        if a.size == 0 or (a.min() >= 0 and a.max() <= np.iinfo(t).max):
            return a.astype(t)
    return a.astype(np.int64)


class PhraseIndex:
    """The files of `odqa build-index`, checked against their manifest."""

    def __init__(self, index_dir: str | os.PathLike, nprobe: int = 64, gpu: bool | None = None):
        self.dir = Path(index_dir)
        manifest_path = self.dir / "manifest.json"
        if not manifest_path.exists():
            raise InputError(f"{self.dir} is not a phrase index (no manifest.json)")
        self.manifest = read_json(manifest_path)
        missing = [k for k in ("vectors", "dim", "max_span_len", "encoder_hash", "fingerprint") if k not in self.manifest]
        if missing:
            raise InputError(f"{manifest_path}: not a phrase index manifest (no {', '.join(missing)})")
        if "files" in self.manifest:
            check_checksums(self.dir, self.manifest, "phrase index")
        else:
            log.warning("%s has no checksums (built before they were recorded): rebuild it to have its files "
                        "checked on opening", self.dir)
        n, dim = self.manifest["vectors"], self.manifest["dim"]
        stored = tuple(self.manifest.get("sides", SIDES))
        if not stored or set(stored) - set(SIDES):
            raise InputError(f"{manifest_path}: sides {stored} are not the start and end sides")
        # the side each query searches: its own, or the one side of a model whose two are one
        self._side = {side: side if side in stored else stored[0] for side in SIDES}
        self._faiss, self._codes, self._from_codes = {}, {}, set()
        for side in stored:
            with loading(self.dir / f"{side}.faiss", "a faiss index"):
                self._faiss[side] = faiss.read_index(str(self.dir / f"{side}.faiss"))
            if (self.dir / f"{side}.codes.npy").exists():
                self._codes[side] = IVFPQCodes.load(self._faiss[side], self.dir, side, n)
                self._from_codes.add(side)
        with loading(self.dir / "meta.npz", "the phrase metadata"):
            self.meta = _read_meta(self.dir / "meta.npz")
        columns = ("passage_row", "token", "char_start", "char_end")
        if any(idx.ntotal != (0 if side in self._from_codes else n) or idx.d != dim for side, idx in self._faiss.items()) \
                or any(len(self.meta[k]) != n for k in columns):
            raise InputError(f"{self.dir}: corrupt phrase index (its files disagree with manifest.json)")
        for side, idx in self._faiss.items():
            ivf = faiss.try_extract_index_ivf(idx)
            if ivf is not None:
                ivf.nprobe = nprobe
                if side not in self._codes:     # an index of version 2, or not an 8-bit IVF-PQ
                    self._codes[side] = IVFPQCodes.of(idx, n)
                    if self._codes[side] is not None:   # held once, as version 3 holds them: lists on demand
                        idx.reset()
                        self._from_codes.add(side)
                if self._codes[side] is None:
                    ivf.make_direct_map()  # vector id -> code, so hits can be read back
        self.nprobe = nprobe
        self._gpu = gpu or (gpu is None and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0)
        self._searchable: dict[str, faiss.Index] = {}
        self._searchable_lock = threading.Lock()
        self._gpu_resources = None
        self.max_span_len = self.manifest["max_span_len"]

    def search(self, side: str, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of MIPS over one side's whole index, (n, k) each (-1 ids where fewer than k).

        An index stored as codes (version 3) is searched from its memory-mapped codes, list by list
        (`IVFPQCodes.search`): faiss's inverted lists are never built in memory, so a process holds
        the metadata and one batch's work, and every process on a node shares the codes through the
        page cache. With GPUs, the index is split across all of them (`_on_gpus`). Any other index
        (Flat, an IVF of another kind) is searched by faiss, from the lists it holds."""
        side = self._side[side]
        if self._gpu:
            with self._searchable_lock:
                if side not in self._searchable:
                    self._searchable[side] = self._on_gpus(side)
            return self._searchable[side].search(q, k)
        codes = self._codes.get(side)
        if codes is not None and side in self._from_codes:
            return codes.search(q, k, self.nprobe)
        return self._faiss[side].search(q, k)

    def _on_gpus(self, side: str) -> faiss.Index:
        """One side's index across every GPU faiss sees, one shard of the vectors each (IndexShards),
        with float16 lookup tables (8-bit PQ codes of 56 bytes and more need them on faiss's GPU, and
        they halve the tables' shared memory for any size). A shard is filled on the CPU from the
        codes, copied to its GPU and dropped, so the CPU holds one shard at a time, never the index."""
        idx, n_gpu = self._faiss[side], faiss.get_num_gpus()
        co = faiss.GpuMultipleClonerOptions()
        co.useFloat16LookupTables = True
        if side not in self._from_codes:   # Flat, or an IVF that holds its lists: faiss shards it
            co.shard = True
            return faiss.index_cpu_to_all_gpus(idx, co, ngpu=n_gpu)
        if self._gpu_resources is None:
            self._gpu_resources = [faiss.StandardGpuResources() for _ in range(n_gpu)]
        n = len(self._codes[side].codes)
        shards = faiss.IndexShards(idx.d, True, False)   # threaded; each shard keeps its ids
        shards.own_indices = True
        for g in range(n_gpu):
            part = faiss.clone_index(idx)   # trained, its lists empty
            self._codes[side].fill(part, np.arange(g * n // n_gpu, (g + 1) * n // n_gpu))
            gpu = faiss.index_cpu_to_gpu(self._gpu_resources[g], g, part, co)
            faiss.extract_index_ivf(gpu).nprobe = self.nprobe
            shards.add_shard(gpu)
            del part
        return shards

    def vectors(self, side: str, ids) -> np.ndarray:
        """Vectors as the index holds them: exact for Flat, decoded from the codes for SQ/PQ, so scores and
        query-side fine-tuning see what search sees (quantisation-aware)."""
        ids, side = np.asarray(ids, dtype=np.int64), self._side[side]
        if not len(ids):
            return np.zeros((0, self.manifest["dim"]), np.float32)
        codes = self._codes.get(side)
        return codes.vectors(ids) if codes is not None else self._faiss[side].reconstruct_batch(ids)

    def scores(self, side: str, ids, q: np.ndarray) -> np.ndarray:
        """q . vector for each id, as `vectors(ids) @ q` but, for IVF-PQ, from the codes through lookup
        tables (asymmetric distance computation) without decoding a vector."""
        side = self._side[side]
        codes = self._codes.get(side)
        if codes is None or not len(ids):
            return self.vectors(side, ids) @ q
        return codes.scores(np.asarray(ids, dtype=np.int64), q)


class IVFPQCodes:
    """The codes of an IVF-PQ index (8-bit codes of residuals to the coarse centroids), optionally behind
    an orthonormal rotation such as OPQ's, in vector-id order, for scoring and decoding vectors by id:
    R x = c[list(x)] + concat_m C_m[code_m(x)], so q . x = (R q) . (R x) without rotating any vector."""

    SCAN_BLOCK = 16_384   # codes of a list scored at once by whole-index search

    def __init__(self, centroids: np.ndarray, pq_centroids: np.ndarray, codes: np.ndarray, list_of: np.ndarray,
                 rotation: np.ndarray | None = None, order: np.ndarray | None = None):
        self.centroids, self.pq_centroids, self.codes, self.list_of = centroids, pq_centroids, codes, list_of
        self.rotation, self.order, self._bounds = rotation, order, None
        self._m = np.arange(codes.shape[1])

    @staticmethod
    def _parts(index: faiss.Index) -> "tuple[faiss.IndexIVFPQ, np.ndarray | None] | None":
        """(the IVF-PQ, the rotation in front of it or None) when `index` is an 8-bit IVF-PQ by residual,
        alone or behind one orthonormal linear transform without bias (OPQ), else None."""
        index = faiss.downcast_index(index)
        rotation = None
        if isinstance(index, faiss.IndexPreTransform):
            if index.chain.size() != 1:
                return None
            transform = faiss.downcast_VectorTransform(index.chain.at(0))
            if not isinstance(transform, faiss.LinearTransform) or transform.have_bias \
                    or transform.d_in != transform.d_out:
                return None
            rotation = faiss.vector_to_array(transform.A).reshape(transform.d_out, transform.d_in)
            if not np.allclose(rotation @ rotation.T, np.eye(len(rotation)), atol=1e-4):
                return None
            index = faiss.downcast_index(index.index)
        if type(index) is not faiss.IndexIVFPQ or index.pq.nbits != 8 or not index.by_residual:
            return None
        return index, rotation

    @classmethod
    def encodes(cls, index: faiss.Index) -> bool:
        """Whether `index` is an 8-bit IVF-PQ (`_parts`) whose vectors are stored as codes and lists."""
        return cls._parts(index) is not None

    @classmethod
    def code_size(cls, index: faiss.Index) -> int:
        return cls._parts(index)[0].pq.M

    @staticmethod
    def encode(index: faiss.Index, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each vector's IVF list and PQ code in a trained `index`, as `add` would store them: faiss's
        `sa_encode` writes the list number (little-endian, in the fewest bytes that hold nlist) and then
        the code."""
        ivf = faiss.extract_index_ivf(index)
        enc = index.sa_encode(x)
        coarse = ivf.coarse_code_size()
        return enc[:, :coarse].astype(np.int64) @ (256 ** np.arange(coarse, dtype=np.int64)), enc[:, coarse:]

    @classmethod
    def _of_parts(cls, ivfpq: faiss.IndexIVFPQ, rotation, codes: np.ndarray, list_of: np.ndarray) -> "IVFPQCodes":
        centroids = ivfpq.quantizer.reconstruct_n(0, ivfpq.nlist)
        pq_centroids = faiss.vector_to_array(ivfpq.pq.centroids).reshape(ivfpq.pq.M, 256, ivfpq.pq.dsub)
        return cls(centroids, pq_centroids, codes, list_of, rotation)

    @classmethod
    def of(cls, index: faiss.Index, n: int) -> "IVFPQCodes | None":
        """The codes of a filled `index` when it is an 8-bit IVF-PQ (`_parts`), else None."""
        parts = cls._parts(index)
        if parts is None:
            return None
        ivfpq, rotation = parts
        m = ivfpq.pq.M
        codes, list_of = np.zeros((n, m), np.uint8), np.zeros(n, np.int32)
        inv = ivfpq.invlists
        for lst in range(ivfpq.nlist):
            size = inv.list_size(lst)
            if size:
                ids = faiss.rev_swig_ptr(inv.get_ids(lst), size)
                codes[ids] = faiss.rev_swig_ptr(inv.get_codes(lst), size * m).reshape(size, m)
                list_of[ids] = lst
        return cls._of_parts(ivfpq, rotation, codes, list_of)

    @classmethod
    def load(cls, index: faiss.Index, directory: Path, side: str, n: int) -> "IVFPQCodes":
        """SIDE.codes.npy and SIDE.lists.npy of `build_index`, for `index`, the trained but empty 8-bit
        IVF-PQ they were taken from (`fill` puts them back into its lists)."""
        parts = cls._parts(index)
        files = [directory / f"{side}.codes.npy", directory / f"{side}.lists.npy"]
        if parts is None or index.ntotal:
            raise InputError(f"{files[0]} belongs to an empty 8-bit IVF-PQ index, and {side}.faiss is not one")
        ivfpq, rotation = parts
        # Memory-mapped: a search behind the pre-filter reads the codes of its documents' vectors only,
        # which the OS pages in and keeps in its cache, shared by every process that opens the index.
        with loading(files[0], "the index's codes"):
            codes = np.load(files[0], allow_pickle=False, mmap_mode="r")
        with loading(files[1], "the index's lists"):
            # kept in the narrow type it is stored in (uint8 or uint16 below 65,536 lists): a vector's
            # list costs 1 or 2 bytes, not 8, at hundreds of millions of vectors
            list_of = np.load(files[1], allow_pickle=False, mmap_mode="r")
        order, order_file = None, directory / f"{side}.order.npy"
        if order_file.exists():   # an index built before the order was stored makes it at its first whole search
            with loading(order_file, "the index's list order"):
                order = np.load(order_file, allow_pickle=False, mmap_mode="r")
            if order.shape != (n,) or order.dtype.kind not in "ui":
                raise InputError(f"{directory}: corrupt phrase index ({order_file.name} disagrees with manifest.json)")
        if codes.shape != (n, ivfpq.pq.M) or codes.dtype != np.uint8 or list_of.shape != (n,) \
                or list_of.dtype.kind not in "ui" or (n and not 0 <= list_of.min() <= list_of.max() < ivfpq.nlist):
            raise InputError(f"{directory}: corrupt phrase index ({side}'s codes or lists disagree with "
                             f"{side}.faiss and manifest.json)")
        loaded = cls._of_parts(ivfpq, rotation, codes, list_of)
        loaded.order = order
        return loaded

    def fill(self, index: faiss.Index, ids: np.ndarray | None = None) -> None:
        """Put the codes (of `ids`, default all) into `index`'s empty inverted lists in id order, as
        `index.add` had put them, so that faiss's own search can scan them (on a GPU)."""
        ivfpq, _ = self._parts(index)
        ids = np.arange(len(self.codes)) if ids is None else np.asarray(ids, np.int64)
        lists = self.list_of[ids]
        order = np.argsort(lists, kind="stable")
        bounds = np.searchsorted(lists[order], np.arange(ivfpq.nlist + 1))
        for lst in np.flatnonzero(np.diff(bounds)):
            at = np.ascontiguousarray(ids[order[bounds[lst]:bounds[lst + 1]]])
            block = np.ascontiguousarray(self.codes[at])
            ivfpq.invlists.add_entries(int(lst), len(at), faiss.swig_ptr(at), faiss.swig_ptr(block))
        ivfpq.ntotal = index.ntotal = len(ids)

    @staticmethod
    def list_order(list_of: np.ndarray) -> np.ndarray:
        """The ids grouped by list, in id order within one (a stable sort), as narrow as the ids."""
        return np.argsort(list_of, kind="stable").astype(_position_type(len(list_of)))

    def search(self, q: np.ndarray, k: int, nprobe: int, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) of the top k of each query among the vectors of its `nprobe` best lists, as
        faiss's IVF-PQ search finds them (coarse score + the PQ lookup-table sum), read from the
        codes list by list: a list's ids are a slice of the list order, its codes a gather from the
        memory-mapped codes. Queries go `batch` at a time, so a list probed by several of them is
        read once for all (256: 1.7x faster a question than 64 on 1.5M vectors)."""
        n_q = len(q)
        scores, ids = np.full((n_q, k), -np.inf, np.float32), np.full((n_q, k), -1, np.int64)
        for a in range(0, n_q, batch):
            scores[a:a + batch], ids[a:a + batch] = self._search_batch(np.asarray(q[a:a + batch], np.float32), k, nprobe)
        return scores, ids

    def _search_batch(self, q: np.ndarray, k: int, nprobe: int) -> tuple[np.ndarray, np.ndarray]:
        if self.rotation is not None:
            q = q @ self.rotation.T
        nlist, (m, _, dsub) = len(self.centroids), self.pq_centroids.shape
        coarse = q @ self.centroids.T                                             # (n, nlist)
        nprobe = min(nprobe, nlist)
        probed = np.argpartition(-coarse, nprobe - 1, axis=1)[:, :nprobe] if nprobe < nlist else \
            np.broadcast_to(np.arange(nlist), (len(q), nlist))
        order, bounds = self._list_order()
        # For inner product the lookup table of q . residual is the same in every list (q . x = q . c +
        # q . r): faiss's PQ scanner over a block of codes, plus the list's coarse score, is what its
        # IVF-PQ search computes, at its speed, without its lists.
        scan = faiss.IndexPQ(m * dsub, m, 8, faiss.METRIC_INNER_PRODUCT)
        faiss.copy_array_to_vector(np.ascontiguousarray(self.pq_centroids, np.float32).ravel(), scan.pq.centroids)
        scan.is_trained = True
        # each query's best k so far, merged after every block: memory for k hits a query, not for
        # every block's (ids -1 and scores -inf until filled)
        best_s, best_i = np.full((len(q), k), -np.inf, np.float32), np.full((len(q), k), -1, np.int64)
        # (query, list) pairs grouped by list: each probed list is read once for the queries that probe it
        lists, which = np.nonzero(_mask(probed, nlist).T)
        cuts = np.flatnonzero(np.diff(lists)) + 1
        for queries, lst in zip(np.split(which, cuts), lists[np.concatenate([[0], cuts])]):
            q_list, q_coarse = np.ascontiguousarray(q[queries]), coarse[queries, lst][:, None]
            # a block of the list at a time: the work in memory is the same however long the lists grow
            for a in range(bounds[lst], bounds[lst + 1], self.SCAN_BLOCK):
                members = order[a:min(a + self.SCAN_BLOCK, bounds[lst + 1])].astype(np.int64)
                # ascending ids (the order is stable): the map read front to back
                faiss.copy_array_to_vector(np.ascontiguousarray(self.codes[members]).ravel(), scan.codes)
                scan.ntotal = len(members)
                s, top = scan.search(q_list, min(k, len(members)))
                s = np.concatenate([best_s[queries], s + q_coarse], axis=1)
                i = np.concatenate([best_i[queries], members[top]], axis=1)
                top = np.argpartition(-s, k - 1, axis=1)[:, :k]
                best_s[queries], best_i[queries] = np.take_along_axis(s, top, 1), np.take_along_axis(i, top, 1)
        order_k = np.lexsort((best_i, -best_s), axis=1)   # by score, ties by id
        return np.take_along_axis(best_s, order_k, 1), np.take_along_axis(best_i, order_k, 1)

    def _list_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids grouped by list, each list's bounds in it): SIDE.order.npy when the index has one, else
        made once here (an index built before it was stored: 4 bytes a vector, in memory)."""
        if self.order is None:
            log.warning("this phrase index has no list order (built before it was stored): making it in memory; "
                        "rebuild the index to have it memory-mapped")
            self.order = self.list_order(self.list_of)
        if self._bounds is None:
            self._bounds = np.concatenate([[0], np.cumsum(np.bincount(self.list_of, minlength=len(self.centroids)))])
        return self.order, self._bounds

    def vectors(self, ids: np.ndarray) -> np.ndarray:
        parts = self.pq_centroids[self._m, self.codes[ids]]            # (n, M, dsub)
        rotated = self.centroids[self.list_of[ids]] + parts.reshape(len(ids), -1)
        return rotated if self.rotation is None else rotated @ self.rotation

    def scores(self, ids: np.ndarray, q: np.ndarray) -> np.ndarray:
        if self.rotation is not None:
            q = self.rotation @ q
        m, dsub = self.pq_centroids.shape[0], self.pq_centroids.shape[2]
        table = np.einsum("mkd,md->mk", self.pq_centroids, q.reshape(m, dsub))   # (M, 256) partial products
        lists = self.list_of[ids]
        coarse = (self.centroids @ q)[lists] if len(self.centroids) <= len(ids) else self.centroids[lists] @ q
        return coarse + table[self._m, self.codes[ids]].sum(1)


def _mask(columns: np.ndarray, width: int) -> np.ndarray:
    """A boolean (rows, width) with True at each row's `columns`."""
    mask = np.zeros((len(columns), width), bool)
    np.put_along_axis(mask, np.asarray(columns), True, axis=1)
    return mask


def _read_meta(path: Path) -> dict[str, np.ndarray]:
    """meta.npz as search uses it: passage_row, passage_count, token, char_start, char_end (unsigned, as narrow
    as stored), in_title (whether a vector is a title token's; stored only by an index with title phrases)."""
    with np.load(path) as z:
        meta = {k: z[k] for k in z.files}
    if "passage_row" not in meta:   # version 2 stores counts only
        count = meta["passage_count"].astype(np.int64)
        # int32 rows: 4 bytes a vector fewer than numpy's default at hundreds of millions of vectors
        meta["passage_row"] = np.repeat(np.arange(len(count), dtype=_position_type(len(count))), count)
    # token, char_start and char_end stay in the narrow unsigned types they are stored in (1 and 2 bytes
    # here, not int32's 4); a caller widens what it gathers before any subtraction, which would wrap.
    # Without title phrases every vector is a text token's: one False seen n times, not n bytes.
    meta["in_title"] = meta["in_title"].astype(bool) if "in_title" in meta else np.broadcast_to(np.False_, len(meta["token"]))
    return meta
