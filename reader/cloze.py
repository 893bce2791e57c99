"""`odqa reader cloze`: question-answering practice made from the corpus itself, for a from-scratch reader.

Span corruption teaches a T5 the language but not the reader's job: find the passage the question is
about and copy a span out of it. Cloze questions teach that job on unlimited data (the salient spans of
REALM, Guu et al. 2020, turned into questions as in Lewis et al. 2019, "Unsupervised Question Answering
by Cloze Translation"): a sentence of a passage with one salient span (a capitalised name or a number)
replaced by a wh-word becomes the question, the span the answer, and the passage sits among k-1 random
passages of other documents. The output is an ordinary FiD file, so `odqa train-reader` trains on it
unchanged, and the reader it makes is then trained on the real questions.

    "Paris is the capital and most populous city of France."
    -> question "Paris is the capital and most populous city of what?", answer "France"
"""
from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

from tqdm import tqdm

from odqa.common.corpus import PassageStore
from odqa.common.io import InputError, atomic_path
from odqa.reader.args import ClozeArgs

log = logging.getLogger(__name__)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
# A run of capitalised words, joined through the particles of names ("University of Oxford").
_NAME = re.compile(r"\b[A-Z][\w'\u2019-]*(?:\s+(?:(?:of|the|de|del|la|le|von|van|da)\s+)?[A-Z][\w'\u2019-]*)*")
_NUMBER = re.compile(r"(?<![\w.,^])\d+(?:,\d{3})*(?:\.\d+)?(?![\w^])")
_YEAR = re.compile(r"^(1[0-9]{3}|20[0-9]{2})$")
# Capitalised only because they open the sentence.
_OPENERS = {"a", "an", "the", "in", "on", "at", "by", "for", "from", "as", "after", "before", "during", "since",
            "he", "she", "it", "they", "his", "her", "its", "their", "this", "these", "there", "when", "while"}


def salient_spans(sentence: str, max_answer_words: int) -> list[tuple[int, int, str]]:
    """(start, end, wh-word) of each name or number in a sentence that could be asked about."""
    spans = []
    for m in _NAME.finditer(sentence):
        start, words = m.start(), m.group().split()
        if start == 0 and words[0].lower() in _OPENERS:
            if len(words) == 1:
                continue
            start = sentence.index(words[1], len(words[0]))
            words = words[1:]
        if len(words) <= max_answer_words and m.end() - start > 1:
            spans.append((start, m.end(), "what"))
    for m in _NUMBER.finditer(sentence):
        spans.append((m.start(), m.end(), "when" if _YEAR.match(m.group()) else "how many"))
    return spans


def cloze_questions(text: str, rng: random.Random, args: ClozeArgs) -> list[tuple[str, str]]:
    """Up to `args.per_passage` (question, answer) pairs from one passage's text."""
    candidates = []
    for sentence in _SENTENCE_END.split(text):
        sentence = sentence.strip()
        n_words = len(sentence.split())
        if not args.min_words <= n_words <= args.max_sentence_words:
            continue
        for start, end, wh in salient_spans(sentence, args.max_answer_words):
            answer = sentence[start:end]
            question = (sentence[:start] + wh + sentence[end:]).rstrip(" .!?;:") + "?"
            if len(question.split()) - 1 >= args.min_words:
                candidates.append((question, answer))
    rng.shuffle(candidates)
    return candidates[: args.per_passage]


def write_cloze_file(args: ClozeArgs) -> dict:
    if args.k < 1:
        raise InputError(f"--k must be at least 1, not {args.k}")
    store = PassageStore(Path(args.corpus))
    n = len(store)
    rng = random.Random(args.seed)
    questions = 0
    with atomic_path(args.out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row, passage in enumerate(tqdm(store, total=n, desc="cloze", mininterval=5)):
            for j, (question, answer) in enumerate(cloze_questions(passage["text"], rng, args)):
                ctxs, draws = [passage], 0
                while len(ctxs) < args.k:
                    other, draws = store[rng.randrange(n)], draws + 1
                    if other["doc_id"] != passage["doc_id"]:
                        ctxs.append(other)
                    elif draws > 100 * args.k:
                        raise InputError(f"{args.corpus}: distractor passages need a corpus of more than one "
                                         f"document")
                rng.shuffle(ctxs)
                f.write(json.dumps({
                    "id": f"cloze-{row}-{j}", "question": question, "answers": [answer],
                    "ctxs": [{"id": c["id"], "title": c["title"], "text": c["text"], "score": float(args.k - r),
                              "has_answer": answer in c["text"]} for r, c in enumerate(ctxs)],
                }, ensure_ascii=False) + "\n")
                questions += 1
        if not questions:   # raised inside the block, so nothing is published
            raise InputError(f"{args.corpus}: no sentence held a name or number to ask about")
    store.close()
    log.info("%d cloze questions from %d passages -> %s", questions, n, args.out)
    return {"questions": questions, "passages": n}
