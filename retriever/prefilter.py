"""The document pre-filter (DHR): each question's top `top_docs` documents first, by a `DocRetriever`
(retriever/doc_index.py) over the same corpus, and the phrase search only over their vectors.

A document's vectors are one contiguous id range (vectors run in passage order and a document's
passages are consecutive), so every vector of the top documents is scored from the index (for IVF-PQ,
from its codes through one lookup table a side) and every phrase in them is paired: exact Eq. 3 within
the documents, in one pass, at a cost that grows with the documents read, not with the index. Passages
are then reranked by z(passage score) + lambda * z(document score) (retriever/rerank.py) over the top
`POOL` by passage score; with lambda = 0 there is nothing to rerank and the pool is k. With a BM25 weight
mu the rerank adds mu * z(BM25 score of the passage) (for a document, of its best passage), scored by
the corpus's BM25 index over the same pool. Lambda and mu default to what `odqa tune-lambda` stored
with the document index.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from odqa.common.io import InputError
from odqa.common.timings import stage
from odqa.retriever.phrase_search import Phrases, PhraseSearch, id_ranges
from odqa.retriever.rerank import doc_z_of, reranked, standardise
from odqa.retriever.results import Queries
from odqa.retriever.search_config import PrefilterConfig

POOL = 100   # passages (documents) the rerank reorders, by passage score


class Prefilter:
    """The pre-filter of `artifacts` (its `prefilter`, a `DocRetriever`), by `config` with the rerank's
    weights tuned where not given."""

    def __init__(self, artifacts, config: PrefilterConfig):
        retriever = artifacts.prefilter
        if retriever is None:
            raise InputError("this search has no document pre-filter")
        self.artifacts = artifacts
        lam = config.lam if config.lam is not None else retriever.tuned_lambda or 0.0
        mu = config.bm25_weight if config.bm25_weight is not None else retriever.tuned_bm25_weight or 0.0
        self.config = replace(config, lam=lam, bm25_weight=mu)

    @property
    def reranks(self) -> bool:
        return bool(self.config.lam or self.config.bm25_weight)

    def documents(self, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each question's top `top_docs` documents: their rows (-1 for none) and scores."""
        return self.artifacts.prefilter.search(questions, self.config.top_docs)

    def search(self, queries: Queries, phrases: PhraseSearch) -> list[Phrases]:
        """Each question's phrases in its top documents (`queries.doc_rows`), best first: every token of
        theirs paired with its best end, so every passage in them gets its best phrase exactly."""
        a, found = self.artifacts, []
        for qs, qe, rows in zip(queries.start, queries.end, queries.doc_rows):
            rows = rows[rows >= 0]
            found.append(phrases.every_phrase(qs, qe, id_ranges(a.doc_vec_start[rows], a.doc_vec_end[rows])))
        return found

    @stage("pre-filter")
    def ranked(self, phrases: Phrases, keys: np.ndarray, best: np.ndarray, unit: str, question: str,
               doc_rows: np.ndarray, doc_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict]]:
        """(keys, best, scores, parts) of one question's candidates (passage or document rows, the
        index of each one's best phrase) in the rerank's order."""
        scores = phrases.score[best].astype(np.float64)
        if not len(keys):
            return keys, best, scores, []
        docs = self.artifacts.table.doc_of_passage[keys] if unit == "passage" else keys
        bm25_z = standardise(self.artifacts.bm25().scores_of(question, phrases.row[best])) \
            if self.config.bm25_weight else None
        order, scores, parts = reranked(scores, doc_z_of(doc_rows, doc_scores, docs), bm25_z, self.config.lam,
                                        self.config.bm25_weight)
        return keys[order], best[order], scores, parts
