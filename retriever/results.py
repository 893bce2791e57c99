"""What a phrase search returns to its caller: each question's `SearchResult`, its passages or documents
as `Hit`s (the public `Passage` or `Document`, and where its phrase lies in the corpus), its top phrases
and its extractive answer, as the public `Phrase`s (`odqa.common.results`), and the answer memory's
`Neighbour`s it consulted. `odqa.Answer` and the retrieval file are made from these. `Queries` holds
what the search's encoders make of a batch of questions, before it searches."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from odqa.common.results import Document, Neighbour, Passage, Phrase


@dataclass(frozen=True)
class Hit:
    """A passage (or a document) a search found: `unit`, the passage row its phrase is in (`row`), and
    the parts of its rank's score where a rerank combined several (`parts`: passage_score, doc_z,
    bm25_z; search_score, cross_score)."""
    unit: Passage | Document
    row: int
    parts: dict = field(default_factory=dict)

    @property
    def score(self) -> float:
        return self.unit.score

    @property
    def phrase(self) -> Phrase | None:
        return self.unit.phrase


@dataclass
class SearchResult:
    """One question's search: its top phrases; its top passages or documents (`hits`, none for a phrase
    search); the phrase string its top hits vote for (`answer`), and, with an answer memory, that vote
    without the memory's help and the memory questions consulted."""
    unit: str                       # phrase, passage or document
    phrases: list[Phrase]
    hits: list[Hit] = field(default_factory=list)
    answer: Phrase | None = None
    answer_without_memory: Phrase | None = None
    memory: list[Neighbour] | None = None

    @property
    def extractive(self) -> Phrase | None:
        """The extractive answer: the vote's for a passage (document) search, else the top phrase."""
        if self.unit != "phrase":
            return self.answer
        return self.phrases[0] if self.phrases else None


@dataclass(frozen=True)
class Queries:
    """A batch of questions as the search's encoders give them (`Searcher.queries`): their phrase start
    and end vectors and, behind a pre-filter, their top documents (rows, -1 for none, and scores)."""
    questions: list[str]
    start: np.ndarray
    end: np.ndarray
    doc_rows: np.ndarray | None = None
    doc_scores: np.ndarray | None = None
