"""The extractive answer as the phrase with the most evidence over the top passages.

A question's first passage shows one phrase, but the same answer string is often the best phrase of
several of its top passages, while a wrong one stands alone. Strength-based aggregation (Wang et al.,
"Evidence Aggregation for Answer Re-Ranking in Open-Domain Question Answering", ICLR 2018) picks the
string whose passages weigh most: each of the top `depth` passages votes for its phrase with weight
exp((score - best score) / temperature), strings are compared as exact match compares them
(`normalize_answer`), and the answer is the winning string's phrase in its highest-ranked passage. The
temperature is in the units of the ranking's scores (behind the default pipeline's rerank, standardised
scores); as it goes to 0, or with depth 1, the answer is the first passage's phrase. A `prior` (the
answer memory's votes, `retriever.answer_memory.memory_votes`) adds weighted votes for phrases of those passages.
"""
from __future__ import annotations

import math
from dataclasses import replace

from odqa.common.metrics import normalize_answer
from odqa.common.results import Phrase
from odqa.common.timings import stage


@stage("aggregation")
def aggregate_answer(hits: list, depth: int, temperature: float, prior: list[tuple[Phrase, float]] = ()) -> Phrase | None:
    """The winning phrase of the first `depth` ranked hits (passages or documents, best first, each with
    its score and phrase), and of `prior`'s (phrase, weight) votes after theirs, as that phrase with its
    `support`: its string's share of the votes. None when nothing shows a phrase."""
    if depth < 1:
        raise ValueError(f"depth must be positive, not {depth}")
    if not temperature > 0:
        raise ValueError(f"temperature must be positive, not {temperature}")
    voters = [h for h in hits[:depth] if h.phrase]
    if not voters and not prior:
        return None
    best = max((h.score for h in voters), default=0.0)
    votes: dict[str, float] = {}
    first: dict[str, Phrase] = {}
    ballots = [(h.phrase, math.exp((h.score - best) / temperature)) for h in voters] + list(prior)
    for phrase, weight in ballots:
        key = normalize_answer(phrase.text)
        votes[key] = votes.get(key, 0.0) + weight
        first.setdefault(key, phrase)
    winner = max(votes, key=votes.get)   # dicts keep insertion order: a tie goes to the higher-ranked string
    return replace(first[winner], support=votes[winner] / sum(votes.values()))
