"""`odqa supervise`: reading-comprehension examples from question/answer pairs by distant supervision.

For each training question, the passages whose text contains an answer (DPR's has_answer; regex for
CuratedTREC) are the positives; BM25 ranks them and the best `positives_per_question` become examples
`{id, question, answers, regex, passage_id, title, text, answer_char_spans, bm25_score, bm25_rank, dataset}`,
`bm25_rank` being the passage's rank among all passages for the question (1 = BM25's first). On a small
corpus most questions' topic is missing, and the answer's string turns up in an unrelated passage: the
rank tells those apart (docs/notes/retrieval.md, "Distant supervision's unrelated passages").
Questions go to train or validation by a hash of the question text, so the split is the same on every
machine and every run, and one question's examples never straddle it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from odqa.common.answer_index import AnswerIndex
from odqa.common.corpus import PassageStore, corpus_info
from odqa.common.io import InputError, atomic_path, read_jsonl, write_json
from odqa.common.metrics.has_answer import answer_spans
from odqa.common.questions import Question, load_questions, question_set_name, split_of
from odqa.common.ranks import current, split_map
from odqa.retriever.bm25 import BM25Index

log = logging.getLogger(__name__)
# Where an example's passage ranks among all passages for its question tells a passage about the question
# from one that holds the answer's string by chance ("31" in Bucharest for the smallest prime above 30).
RELEVANT_RANK = 20


def supervise(question_sets: Sequence[str], corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
              positives_per_question: int = 1, validation_percent: float = 10.0) -> dict:
    """Under a launcher each rank searches its share of each set's questions, and rank 0 writes the
    files (common/ranks.py); a search cut short resumes from its finished batches."""
    corpus_dir, out_dir, ranks = Path(corpus_dir), Path(out_dir), current()
    store = PassageStore(corpus_dir)
    answers_index = AnswerIndex.open(corpus_dir)
    bm25 = BM25Index.open(corpus_dir)
    fingerprint = corpus_info(corpus_dir)["fingerprint"]
    stats = {"corpus": str(corpus_dir), "fingerprint": fingerprint,
             "positives_per_question": positives_per_question, "validation_percent": validation_percent,
             "datasets": {}, "examples": {"train": 0, "validation": 0}}

    def examples_of(q: Question, dataset: str) -> list[dict]:
        rows = answers_index.find(q.answers, q.regex)
        if not rows:
            return []
        every = bm25.scores(q.question)
        scores = every[rows]
        out = []
        for i in np.argsort(-scores, kind="stable")[:positives_per_question]:
            p = store[rows[i]]
            out.append({"id": q.id, "question": q.question, "answers": q.answers, "regex": q.regex,
                        "passage_id": p["id"], "title": p["title"], "text": p["text"],
                        "answer_char_spans": answer_spans(p["text"], q.answers, q.regex),
                        "bm25_score": float(scores[i]), "bm25_rank": int((every > scores[i]).sum()) + 1,
                        "dataset": dataset})
        return out
    if ranks.main:
        out_dir.mkdir(parents=True, exist_ok=True)
    ranks.barrier()
    with contextlib.ExitStack() as stack:
        if ranks.main:
            files = {split: stack.enter_context(open(stack.enter_context(atomic_path(out_dir / f"{split}.jsonl")), "w",
                                                     encoding="utf-8"))
                     for split in ("train", "validation")}
        for name in question_sets:
            dataset = question_set_name(name)
            questions = load_questions(name)
            found = split_map(lambda batch: [examples_of(q, dataset) for q in batch], questions, 256,
                              out_dir / f".{dataset}.parts", {"questions": name, "corpus": fingerprint,
                                                               "positives": positives_per_question},
                              desc=f"supervise {dataset}")
            counts = {"train": 0, "validation": 0}
            asked = {"train": 0, "validation": 0}
            in_top = 0
            for q, examples in zip(questions, found):
                split = split_of(q.question, validation_percent)
                asked[split] += 1
                counts[split] += bool(examples)
                for example in examples:
                    in_top += example["bm25_rank"] <= RELEVANT_RANK
                    if ranks.main:
                        files[split].write(json.dumps(example, ensure_ascii=False) + "\n")
                    stats["examples"][split] += 1
            stats["datasets"][dataset] = {
                "questions": len(questions), "with_positive": sum(counts.values()),
                "with_positive_percent": 100.0 * sum(counts.values()) / len(questions),
                "train_questions": counts["train"], "validation_questions": counts["validation"],
                "train_asked": asked["train"], "validation_asked": asked["validation"],
                f"examples_in_bm25_top{RELEVANT_RANK}": in_top}
            log.info("%s: %d of %d questions have a positive passage; %d of the passages rank in BM25's top %d for "
                     "their question", dataset, sum(counts.values()), len(questions), in_top, RELEVANT_RANK)
    store.close()
    if ranks.main:
        write_json(out_dir / "stats.json", stats)
    ranks.barrier()
    return stats


def load_examples(path: str | os.PathLike, limit: int | None = None) -> list[dict]:
    """The supervision examples of a file `supervise` wrote (the first `limit`), each checked for what
    the trainers read."""
    out = []
    for lineno, ex in read_jsonl(path):
        for key in ("question", "title", "text", "answers", "answer_char_spans"):
            if key not in ex:
                raise InputError(f"{path}:{lineno}: supervision example without {key!r}")
        out.append(ex)
        if limit and len(out) >= limit:
            break
    if not out:
        raise InputError(f"{path}: no examples")
    return out
