"""Test-train overlap of question sets, after Lewis, Stenetorp & Riedel (EACL 2021), "Question and
Answer Test-Train Overlap in Open-Domain Question Answering Datasets".

Each test question falls in one part:
- "question overlap": its nearest training question (TF-IDF cosine over SQuAD-normalised words) is
  at least `threshold` alike and shares a normalised answer with it: a paraphrase a reader may answer
  from memory;
- "answer overlap only": some training question has one of its answers, but none is a paraphrase;
- "no overlap": none of its answers is a training answer.
The paper annotates paraphrases by hand; the cosine threshold stands in for that, so the first part
holds some questions that only look alike ("when did X win" / "when did X lose" share the answer
only by chance, and are counted).
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from odqa.common.metrics.answers import normalize_answer

PARTS = ("question overlap", "answer overlap only", "no overlap")


def _words(question: str) -> list[str]:
    return normalize_answer(question).split()


def nearest_questions(test: Sequence[str], train: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For each test question, the index of its nearest training question and their cosine, over
    TF-IDF vectors (idf from both sets) of SQuAD-normalised words. Scored through an inverted index
    of the training questions, so a 79k-question train split costs seconds, not a dense matrix."""
    if not train:
        raise ValueError("no training questions to compare with")
    test_words = [Counter(_words(q)) for q in test]
    train_words = [Counter(_words(q)) for q in train]
    df = Counter(w for bag in test_words + train_words for w in bag)
    idf = {w: math.log((len(test) + len(train)) / n) for w, n in df.items()}

    def unit(bag: Counter) -> dict[str, float]:
        vec = {w: c * idf[w] for w, c in bag.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        return {w: v / norm for w, v in vec.items()}

    postings: dict[str, tuple[list[int], list[float]]] = {}
    for i, bag in enumerate(train_words):
        for w, v in unit(bag).items():
            ids, weights = postings.setdefault(w, ([], []))
            ids.append(i)
            weights.append(v)
    postings_np = {w: (np.asarray(ids), np.asarray(weights)) for w, (ids, weights) in postings.items()}

    best = np.zeros(len(test), dtype=np.int64)
    cosine = np.zeros(len(test), dtype=np.float64)
    scores = np.zeros(len(train), dtype=np.float64)
    for t, bag in enumerate(test_words):
        scores[:] = 0.0
        for w, v in unit(bag).items():
            if w in postings_np:
                ids, weights = postings_np[w]
                scores[ids] += v * weights      # a word occurs once per training question's postings
        best[t] = int(scores.argmax())
        cosine[t] = scores[best[t]]
    return best, cosine


def overlap_parts(test: Sequence[tuple[str, Sequence[str]]], train: Sequence[tuple[str, Sequence[str]]],
                  threshold: float = 0.7) -> list[dict]:
    """Each test (question, answers)'s part, nearest training question and cosine, in order."""
    train_answers = {normalize_answer(a) for _, answers in train for a in answers} - {""}
    best, cosine = nearest_questions([q for q, _ in test], [q for q, _ in train])
    out = []
    for (question, answers), j, cos in zip(test, best, cosine):
        golds = {normalize_answer(a) for a in answers} - {""}
        near_question, near_answers = train[j]
        if cos >= threshold and golds & {normalize_answer(a) for a in near_answers}:
            part = PARTS[0]
        elif golds & train_answers:
            part = PARTS[1]
        else:
            part = PARTS[2]
        out.append({"part": part, "nearest": near_question, "cosine": float(cos)})
    return out
