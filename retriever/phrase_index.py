"""A phrase index: the files `odqa build-index` (retriever/index_build.py) writes, opened and checked
against their manifest, and searched.

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
give each passage's slice.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import faiss
import numpy as np

from odqa.common.io import InputError, check_checksums, loading, read_object
from odqa.retriever.index_gpu import on_gpus
from odqa.retriever.ivfpq_codes import IVFPQCodes, position_type

log = logging.getLogger(__name__)
MANIFEST_VERSION = 3   # 3: IVF-PQ codes beside the .faiss files, not inside them (2 still opens)
SIDES = ("start", "end")


class PhraseIndex:
    """The files of `odqa build-index`, checked against their manifest."""

    def __init__(self, index_dir: str | os.PathLike, nprobe: int = 64, gpu: bool | None = None):
        self.dir = Path(index_dir)
        manifest_path = self.dir / "manifest.json"
        if not manifest_path.exists():
            raise InputError(f"{self.dir} is not a phrase index (no manifest.json)")
        self.manifest = read_object(manifest_path, "a phrase index manifest")
        missing = [k for k in ("vectors", "dim", "max_span_len", "encoder_hash", "fingerprint") if k not in self.manifest]
        if missing:
            raise InputError(f"{manifest_path}: not a phrase index manifest (no {', '.join(missing)})")
        wrong = [k for k in ("vectors", "dim", "max_span_len", "version") if k in self.manifest
                 and (type(self.manifest[k]) is not int or self.manifest[k] < 0)]
        if wrong:
            raise InputError(f"{manifest_path}: its {wrong[0]!r} is {self.manifest[wrong[0]]!r}, not a count")
        n, dim = self.manifest["vectors"], self.manifest["dim"]
        stored = self.manifest.get("sides", SIDES)
        if not isinstance(stored, (list, tuple)) or not stored or set(stored) - set(SIDES):
            raise InputError(f"{manifest_path}: sides {stored} are not the start and end sides")
        stored = tuple(stored)
        if "files" in self.manifest or self.manifest.get("version", 1) >= 3:
            # every file this opening reads is one the manifest records: a version-3 manifest stripped of its
            # files would otherwise search codes no check covers
            reads = [f"{side}.faiss" for side in stored] + ["meta.npz"] + \
                [p.name for side in stored for p in sorted(self.dir.glob(f"{side}.*.npy"))]
            check_checksums(self.dir, self.manifest, "phrase index", reads=reads)
        else:
            log.warning("%s has no checksums (built before they were recorded): rebuild it to have its files "
                        "checked on opening", self.dir)
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
        page cache. With GPUs, the index is split across all of them (`retriever.index_gpu`). Any other index
        (Flat, an IVF of another kind) is searched by faiss, from the lists it holds."""
        side = self._side[side]
        if self._gpu:
            with self._searchable_lock:
                if side not in self._searchable:
                    self._searchable[side] = on_gpus(self, side)
            return self._searchable[side].search(q, k)
        codes = self._codes.get(side)
        if codes is not None and side in self._from_codes:
            return codes.search(q, k, self.nprobe)
        return self._faiss[side].search(q, k)

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


def _read_meta(path: Path) -> dict[str, np.ndarray]:
    """meta.npz as search uses it: passage_row, passage_count, token, char_start, char_end (unsigned, as narrow
    as stored), in_title (whether a vector is a title token's; stored only by an index with title phrases)."""
    with np.load(path) as z:
        meta = {k: z[k] for k in z.files}
    if "passage_row" not in meta:   # version 2 stores counts only
        count = meta["passage_count"].astype(np.int64)
        # int32 rows: 4 bytes a vector fewer than numpy's default at hundreds of millions of vectors
        meta["passage_row"] = np.repeat(np.arange(len(count), dtype=position_type(len(count))), count)
    # token, char_start and char_end stay in the narrow unsigned types they are stored in (1 and 2 bytes
    # here, not int32's 4); a caller widens what it gathers before any subtraction, which would wrap.
    # Without title phrases every vector is a text token's: one False seen n times, not n bytes.
    meta["in_title"] = meta["in_title"].astype(bool) if "in_title" in meta else np.broadcast_to(np.False_, len(meta["token"]))
    return meta
