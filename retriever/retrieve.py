"""Run any retriever over a question set and write DPR's retrieval-results file.

`retrieve` takes anything with `search_passages(questions, k) -> (rows, scores)`, rows indexing the
corpus's passages.jsonl; `retrieve_phrases` takes a phrase `Searcher` and also keeps its phrases.
Both split the questions by rank under a launcher and resume from their finished batches, given a
`parts` directory (common/ranks.py); every rank gets every entry.
"""
from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Any, Protocol, Sequence

import numpy as np

from odqa.common.corpus import PassageStore
from odqa.common.metrics.has_answer import TokenizedText
from odqa.common.questions import Question
from odqa.common.ranks import split_map
from odqa.common.retrieval_file import make_entry

log = logging.getLogger(__name__)


class Retriever(Protocol):
    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]: ...


def retrieve(retriever: Retriever, store: PassageStore, questions: Sequence[Question], k: int,
             batch_size: int = 256, parts: str | os.PathLike | None = None, key: Any = None) -> list[dict]:
    """DPR-format entries of a passage retriever (BM25, dense, documents)."""
    passage = _passage_cache(store)

    def batch_entries(batch: Sequence[Question]) -> list[dict]:
        rows, scores = retriever.search_passages([q.question for q in batch], k)
        return [_entry(q, r, s, passage) for q, r, s in zip(batch, rows, scores)]
    return split_map(batch_entries, questions, batch_size, parts, key, desc="retrieve")


def retrieve_phrases(searcher, questions: Sequence[Question], k: int, batch_size: int = 64,
                     parts: str | os.PathLike | None = None, key: Any = None) -> list[dict]:
    """DPR-format entries of a phrase `Searcher`: a passage's score is its best phrase's, each ctx
    carries that phrase, and the searcher's extractive answer (the phrase its top passages vote for) is
    the entry's "prediction"; with an answer memory, the vote without it is its
    "prediction_without_memory"."""
    tokens = _token_cache()

    def encoded(batch: Sequence[Question]):
        return searcher.queries([q.question for q in batch])

    def batch_entries(batch: Sequence[Question], queries) -> list[dict]:
        entries = []
        for q, r in zip(batch, searcher.search(queries.questions, k, unit="passage", queries=queries)):
            # read by the searcher already: only their tokens are made here (once a row)
            ps = [{"id": h.unit.id, "title": h.unit.title, "text": h.unit.text} for h in r.hits]
            entry = make_entry(q, ps, np.array([h.score for h in r.hits], dtype=np.float32),
                               [tokens(h.row, h.unit.text) for h in r.hits])
            top = r.extractive
            entry["prediction"] = top.text if top else ""
            if r.memory is not None:   # the memory questions consulted: which answers had their help
                entry["memory"] = [nb.to_dict() for nb in r.memory]
                own = r.answer_without_memory   # the phrase model's own answer, as the papers report it
                entry["prediction_without_memory"] = own.text if own else ""
            for ctx, h in zip(entry["ctxs"], r.hits):
                ph = h.phrase
                ctx["phrase"] = {"text": ph.text, "in_title": ph.in_title, "char_start": ph.char_start,
                                 "char_end": ph.char_end, "score": ph.score}
                # reranked: both parts of the final score, so the rerank can be studied from the file
                ctx.update({name: h.parts[name] for name in ("search_score", "cross_score") if name in h.parts})
            entries.append(entry)
        return entries
    # the next batch is encoded while this one is searched (common/prefetch.py)
    return split_map(batch_entries, questions, batch_size, parts, key, desc="retrieve", prepare=encoded)


def _passage_cache(store: PassageStore):
    # Popular passages come back for many questions: read and tokenise each once.
    @lru_cache(maxsize=200_000)
    def passage(row: int) -> tuple[dict, TokenizedText]:
        p = store[row]
        return p, TokenizedText(p["text"])
    return passage


def _token_cache():
    @lru_cache(maxsize=200_000)
    def tokens(row: int, text: str) -> TokenizedText:
        return TokenizedText(text)
    return tokens


def _entry(q: Question, rows: np.ndarray, scores: np.ndarray, passage) -> dict:
    keep = rows >= 0  # a retriever may find fewer than k passages
    hits = [passage(int(r)) for r in rows[keep]]
    return make_entry(q, [p for p, _ in hits], scores[keep], [t for _, t in hits])
