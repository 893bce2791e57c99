"""The codes of an 8-bit IVF-PQ phrase index, held apart from faiss's own lists: memory-mapped, in
vector-id order, scored by id (behind the pre-filter) and searched list by list (the whole index) with
faiss's own PQ scanner.
"""
from __future__ import annotations

import logging
from pathlib import Path

import faiss
import numpy as np

from odqa.common.io import InputError, loading

log = logging.getLogger(__name__)


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
        self._table_at = self._m * pq_centroids.shape[1]   # part m's code c in the flat lookup table: m x 256 + c

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
        return np.argsort(list_of, kind="stable").astype(position_type(len(list_of)))

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
        # one flat gather: the same partial products as table[m, code], in 2/3 of the time
        return coarse + table.ravel()[self._table_at + self.codes[ids]].sum(1)


def _mask(columns: np.ndarray, width: int) -> np.ndarray:
    """A boolean (rows, width) with True at each row's `columns`."""
    mask = np.zeros((len(columns), width), bool)
    np.put_along_axis(mask, np.asarray(columns), True, axis=1)
    return mask


def position_type(n: int) -> type:
    """int32 for positions below n where it holds them all: 4 bytes a vector fewer than int64."""
    return np.int32 if n < 2**31 else np.int64


def narrow(a: np.ndarray) -> np.ndarray:
    for t in (np.uint8, np.uint16, np.uint32):
        if a.size == 0 or (a.min() >= 0 and a.max() <= np.iinfo(t).max):
            return a.astype(t)
    return a.astype(np.int64)
