"""One `Searcher` over a phrase index: phrases, passages and documents from the same vectors, and the
extractive answer they vote for. It is a facade over the search's parts, a module each:

    search_artifacts.py   the index, the models and the corpus, opened and checked against each other
    phrase_search.py      phrase search (DensePhrases): MIPS, the phrases a passage shows
    prefilter.py          the document pre-filter (DHR) and its rerank by the document score
    rerank.py             the rerank's arithmetic, and the cross-encoder's reordering
    answer_memory.py      the training questions whose answers lend votes
    answer_aggregation.py the vote that makes the extractive answer

    s = Searcher.open(index, model, corpus, doc_index, doc_model)
    s.search(["who wrote hamlet"], k=10)       # [SearchResult]: .hits (passages), .answer, .phrases
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from odqa.common.io import InputError
from odqa.common.settings import updated
from odqa.retriever.answer_aggregation import aggregate_answer
from odqa.retriever.answer_memory import memory_votes, question_vectors
from odqa.retriever.phrase_model import question_vectors_of
from odqa.retriever.phrase_search import PhraseSearch, group
from odqa.retriever.prefilter import POOL, Prefilter
from odqa.retriever.rerank import cross_reranked
from odqa.retriever.results import Queries, SearchResult
from odqa.retriever.search_artifacts import SearchArtifacts
from odqa.retriever.search_config import SearchConfig

UNITS = ("phrase", "passage", "document")


class Searcher:
    def __init__(self, artifacts: SearchArtifacts, config: SearchConfig | None = None, batch_size: int = 64):
        """`config`: the search settings (`SearchConfig`'s defaults where None), one section a part."""
        self.artifacts, self.batch_size = artifacts, batch_size
        self.config = config = config or SearchConfig()
        if config.phrase.nprobe != artifacts.index.nprobe:
            raise InputError("nprobe is set when the index opens: open another searcher (odqa.load(nprobe=...))")
        if artifacts.prefilter is None and (config.prefilter.lam or config.prefilter.bm25_weight):
            raise InputError("a rerank weight (lam, bm25_weight) weighs the document pre-filter's scores: this "
                             "search has no pre-filter")
        self.phrases = PhraseSearch(artifacts, config.phrase)
        self.prefilter = Prefilter(artifacts, config.prefilter) if artifacts.prefilter is not None else None

    @classmethod
    def open(cls, index: str | os.PathLike, model: str | os.PathLike, corpus: str | os.PathLike,
             doc_index: str | os.PathLike | None = None, doc_model: str | os.PathLike | None = None,
             config: SearchConfig | None = None, *, reranker: str | os.PathLike | None = None,
             memory: str | os.PathLike | None = None, device: str | None = None, dtype=None,
             trained: bool = False) -> "Searcher":
        """The phrase index and model, behind the document pre-filter when `doc_index` is given (with the
        `doc_model` it was built with), the passage reranker (`odqa train-reranker`) and the answer memory
        (`odqa build-memory`) where given (`SearchArtifacts`), searched by `config`."""
        config = config or SearchConfig()
        return cls(SearchArtifacts(index, model, corpus, doc_index, doc_model, reranker=reranker, memory=memory,
                                   nprobe=config.phrase.nprobe, device=device, dtype=dtype,
                                   trained=trained), config)

    def with_settings(self, **settings) -> "Searcher":
        """This searcher with other settings (`SearchConfig`'s, by name, but nprobe, which the index is
        opened with): the same index, models and corpus, shared, not loaded again, and this one left as
        it is (the server searches for other requests meanwhile)."""
        return Searcher(self.artifacts, updated(self.config, settings), self.batch_size)

    def queries(self, questions: list[str]) -> Queries:
        """The questions through the search's encoders: the phrase model's start and end vectors, and
        the pre-filter's top documents. This part of a search is torch and faiss, which let go of the
        GIL, so a caller with batches to go makes the next batch's queries while `search` reads this
        one's passages (`retrieve_phrases`, common/prefetch.py)."""
        q_start, q_end = self.encode(questions)
        docs = self.prefilter.documents(questions) if self.prefilter is not None else (None, None)
        return Queries(list(questions), q_start, q_end, *docs)

    def encode(self, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The phrase model's start and end vectors of the questions."""
        a = self.artifacts
        return question_vectors_of(a.model, a.tokenizer, questions, self.batch_size, a.device)

    def search(self, questions: list[str], k: int = 10, unit: str = "passage",
               max_phrases: int | None = None, queries: Queries | None = None) -> list[SearchResult]:
        """For each question its top phrases and, for unit passage/document, its top k of those with the
        extractive answer their top `answer_depth` vote for. Without a pre-filter, MIPS goes deeper until
        k passages (documents) come back, up to `max_phrases` hits a side (`PhraseSearch.deep_enough`).
        `queries`: the questions' `queries`, where the caller made them already."""
        if unit not in UNITS:
            raise InputError(f"unit must be one of {UNITS}, not {unit!r}")
        if k < 1:
            raise InputError(f"k must be positive, not {k}")
        c, a = self.config, self.artifacts
        if queries is None:
            queries = self.queries(questions)
        if queries.questions != list(questions):
            raise ValueError("these queries were made for other questions")
        q_start, q_end = queries.start, queries.end
        # The answer must not depend on how many passages the caller reads: search as deep as it votes.
        n = k if unit == "phrase" else max(k, c.answer.answer_depth)
        cross = a.reranker is not None and unit == "passage"
        depth = max(n, c.reranker.rerank_depth) if cross else n
        if self.prefilter is not None:
            found = self.prefilter.search(queries, self.phrases)
        else:
            found = self.phrases.deep_enough(q_start, q_end, depth, unit, a.table, max_phrases)
        neighbours = a.memory.neighbours(question_vectors(q_start, q_end), c.memory.memory_neighbours,
                                         c.memory.memory_threshold) if a.memory is not None and unit != "phrase" else None
        results = []
        for i, (question, phrases) in enumerate(zip(questions, found)):
            query = (question, q_start[i], q_end[i])
            if unit == "phrase":
                results.append(SearchResult(unit, self.phrases.top_phrases(phrases, k, question, c.answer)))
                continue
            keys, best = group(phrases, unit, a.table)
            pool = max(depth, POOL) if self.prefilter is not None and self.prefilter.reranks else depth
            keys, best = keys[:pool], best[:pool]
            if self.prefilter is not None:
                keys, best, scores, parts = self.prefilter.ranked(phrases, keys, best, unit, question,
                                                                  queries.doc_rows[i], queries.doc_scores[i])
            else:
                scores, parts = phrases.score[best].astype(np.float64), [{} for _ in keys]
            hits = self.phrases.hits(phrases, keys[:depth], best[:depth], scores[:depth].tolist(), parts[:depth],
                                     unit, query, c.answer)
            if cross:
                hits = cross_reranked(a.reranker, question, hits, n)
            result = SearchResult(unit, [self.phrases.phrase(phrases.at(j)) for j in range(min(depth, len(phrases)))],
                                  hits)
            self._answer(result, query, neighbours[i] if neighbours is not None else None)
            result.hits = hits[:k]
            results.append(result)
        return results

    def _answer(self, result: SearchResult, query: tuple, neighbours) -> None:
        """The result's extractive answer: its top hits' vote, with the memory's votes where it has one,
        and the vote without them too (the phrase model's own answer)."""
        c, votes = self.config, []
        if neighbours is not None:
            question, qs, qe = query
            votes = memory_votes(neighbours, result.hits[:c.answer.answer_depth], c.memory.memory_weight,
                                 lambda row, answer: self.phrases.indexed_phrase(row, answer, question, qs, qe,
                                                                                 c.answer.answer_filter))
            result.memory = neighbours
            result.answer_without_memory = aggregate_answer(result.hits, c.answer.answer_depth,
                                                            c.answer.answer_temperature)
        result.answer = aggregate_answer(result.hits, c.answer.answer_depth, c.answer.answer_temperature, votes)

    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and scores of the top k passages: the interface `retriever.retrieve` runs."""
        rows = np.full((len(questions), k), -1, dtype=np.int64)
        scores = np.full((len(questions), k), -np.inf, dtype=np.float32)
        for i, r in enumerate(self.search(questions, k, unit="passage")):
            for j, h in enumerate(r.hits):
                rows[i, j], scores[i, j] = h.row, h.score
        return rows, scores


def without_rerank(config: SearchConfig) -> SearchConfig:
    """`config` with the search's own order alone: its rerank's weights 0, whatever was tuned."""
    return dataclasses.replace(config, prefilter=dataclasses.replace(config.prefilter, lam=0.0, bm25_weight=0.0))
