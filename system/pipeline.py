"""The product in one object: a question goes through one retrieval and comes back with two answers.

    Pipeline(searcher, reader).answer(["who ..."], k=10) ->
        [{"question", "extractive": {text, score, passage_id, char_start, char_end},
          "generated": str, "passages": [{id, title, text, score, phrase}], "memory": [...], "timings": {...}}]

One phrase search (behind the document pre-filter when the searcher has one) yields both the top
passage's phrase, the extractive answer, and the top-k passages, which the FiD reader reads to
generate the other answer. With an answer memory, "memory" lists the training questions whose answers
the extractive answer's vote consulted. Timings are per batch, in milliseconds, for each stage.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

from odqa.common.device import pick_device
from odqa.common.io import InputError
from odqa.reader.fid_data import FiDExample
from odqa.reader.read import generate_answers, load_reader
from odqa.retriever.searcher import top_phrase

MAX_K = 100


@dataclass
class ReaderSettings:
    text_maxlength: int = 200
    max_new_tokens: int = 32
    num_beams: int = 1
    batch_size: int = 8
    decoding: str = "spans"          # spans: the answer is a passage span (reader/spans.py) | free | phrases


class Pipeline:
    def __init__(self, searcher, reader_model, reader_tokenizer, settings: ReaderSettings = ReaderSettings(),
                 device: str | None = None):
        self.searcher = searcher
        self.model, self.tokenizer = reader_model, reader_tokenizer
        self.settings = settings
        self.device = pick_device(device)

    @classmethod
    def load(cls, searcher, reader_path: str | os.PathLike, settings: ReaderSettings = ReaderSettings()) -> "Pipeline":
        device = pick_device()
        model, tokenizer = load_reader(reader_path, device)
        return cls(searcher, model, tokenizer, settings, device)

    def answer(self, questions: list[str], k: int = 10) -> list[dict]:
        if not 1 <= k <= MAX_K:
            raise InputError(f"k must be in 1..{MAX_K}, not {k}")
        questions = [q.strip() if isinstance(q, str) else q for q in questions]
        t0 = time.perf_counter()
        results = self.searcher.search(questions, k, unit="passage")
        t1 = time.perf_counter()
        s = self.settings
        examples = [FiDExample(id=str(i), question=q, answers=[], passages=[(p["title"], p["text"]) for p in r["passages"]],
                               phrases=[(p["phrase"]["text"], p["phrase"]["score"]) if p.get("phrase") else None
                                        for p in r["passages"]])
                    for i, (q, r) in enumerate(zip(questions, results))]
        generated = generate_answers(self.model, self.tokenizer, examples, k, s.batch_size, s.text_maxlength,
                                     s.max_new_tokens, s.num_beams, self.device, progress=False, decoding=s.decoding)
        t2 = time.perf_counter()
        timings = {"retrieve_ms": 1000 * (t1 - t0), "read_ms": 1000 * (t2 - t1), "questions_in_batch": len(questions)}
        out = []
        for q, r, g in zip(questions, results, generated):
            top = top_phrase(r)
            out.append({"question": q,
                        "extractive": None if top is None else {
                            **{key: top[key] for key in ("text", "score", "passage_id", "in_title", "char_start", "char_end")},
                            "support": top.get("support")},
                        "generated": g,
                        "passages": [{key: p[key] for key in ("id", "title", "text", "score", "phrase")} for p in r["passages"]],
                        **({"memory": r["memory"]} if "memory" in r else {}),
                        "timings": timings})
        return out
