"""How the document pre-filter's speed-up grows with the corpus: phrase search over a Flat index of
random vectors, without the pre-filter and with it (top K documents by a Flat document index, then
every phrase of their vectors scored from the index), at several corpus sizes, in one run.
Random vectors are fine for timing: the cost depends on counts, not values.

Without the pre-filter it times `PhraseSearch.mips` (the start and end MIPS, the windowed best partner,
the merging), the first round of k' = 2k hits; with it the document search, then `PhraseSearch.every_phrase`
over the top K documents' vectors, as the pre-filter searches (retriever/prefilter.py), which needs no
second round.
Question encoding is left out (the pre-filter adds one document-question encoding, measured by
scripts/report_dhr.py).

    python scripts/bench_prefilter.py [--passages 12500 50000 200000] [--passages-per-doc 10]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from types import SimpleNamespace

import faiss
import numpy as np

from odqa.retriever.phrase_index import PhraseIndex
from odqa.retriever.phrase_search import PhraseSearch, id_ranges
from odqa.retriever.search_config import PhraseSearchConfig


def synthetic_searcher(n_passages: int, per_doc: int, vecs_per_passage: int, dim: int, rng) -> PhraseSearch:
    n_vec = n_passages * vecs_per_passage
    index = PhraseIndex.__new__(PhraseIndex)
    index._faiss = {"start": faiss.IndexFlatIP(dim), "end": faiss.IndexFlatIP(dim)}
    for side in index._faiss.values():
        for a in range(0, n_vec, 1_000_000):
            side.add(rng.standard_normal((min(1_000_000, n_vec - a), dim), dtype=np.float32))
    index._codes, index._from_codes, index._gpu = {}, set(), False
    index._side = {"start": "start", "end": "end"}
    index._searchable, index._searchable_lock, index._gpu_resources = dict(index._faiss), threading.Lock(), None
    index.max_span_len = 20
    index.manifest = {"vectors": n_vec, "dim": dim, "max_span_len": 20}
    index.meta = {"passage_row": np.repeat(np.arange(n_passages), vecs_per_passage),
                  "token": np.tile(np.arange(vecs_per_passage), n_passages),
                  "char_start": np.zeros(n_vec, np.int64), "char_end": np.zeros(n_vec, np.int64),
                  "in_title": np.zeros(n_vec, bool)}
    n_docs = n_passages // per_doc
    start = np.arange(n_docs, dtype=np.int64) * per_doc * vecs_per_passage
    artifacts = SimpleNamespace(index=index, doc_vec_start=start, doc_vec_end=start + per_doc * vecs_per_passage)
    return PhraseSearch(artifacts, PhraseSearchConfig(max_answer_tokens=20))


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--passages", type=int, nargs="+", default=[12_500, 50_000, 200_000])
    p.add_argument("--passages-per-doc", type=int, default=10)
    p.add_argument("--vectors-per-passage", type=int, default=16)
    p.add_argument("--dim", type=int, default=192)
    p.add_argument("--doc-dim", type=int, default=384)
    p.add_argument("--top-docs", type=int, default=100)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"Flat phrase index, {args.vectors_per_passage} vectors/passage of {args.dim} dims, {args.passages_per_doc} "
          f"passages/document, K = {args.top_docs} documents, k' = {2 * args.k} hits a side, batch {args.batch}, "
          f"{faiss.omp_get_max_threads()} threads")
    print("| passages | documents | phrase vectors | ms/q without | ms/q with pre-filter (doc search + phrase search) "
          "| speed-up |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.passages:
        s = synthetic_searcher(n, args.passages_per_doc, args.vectors_per_passage, args.dim, rng)
        n_docs = len(s.artifacts.doc_vec_start)
        doc_index = faiss.IndexFlatIP(args.doc_dim)
        doc_index.add(rng.standard_normal((n_docs, args.doc_dim), dtype=np.float32))
        qs, qe = (rng.standard_normal((args.batch, args.dim), dtype=np.float32) for _ in range(2))
        qd = rng.standard_normal((args.batch, args.doc_dim), dtype=np.float32)

        def without():
            s.mips(qs, qe, 2 * args.k)

        def with_prefilter():
            _, rows = doc_index.search(qd, min(args.top_docs, n_docs))
            a = s.artifacts
            for q_start, q_end, r in zip(qs, qe, rows):
                s.every_phrase(q_start, q_end, id_ranges(a.doc_vec_start[r], a.doc_vec_end[r]))

        t0, t1 = timed(without, args.repeats), timed(with_prefilter, args.repeats)
        print(f"| {n:,} | {n_docs:,} | {s.artifacts.index.manifest['vectors']:,} | {1000 * t0 / args.batch:.2f} | "
              f"{1000 * t1 / args.batch:.2f} | {t0 / t1:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
