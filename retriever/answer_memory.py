"""The answer memory: the training questions, their answers, and their question vectors.

Questions are asked again in other words ("who won ncaa womens basketball championship in 2017", "who
won the 2017 womens ncaa basketball championship"), and a phrase model trained on one wording need not
read the answer right under the other. The memory keeps each training question's
vector, from the same question encoders that search (their start and end [CLS] vectors, concatenated
and L2-normalised), with its answers. At search time a question's nearest memory questions whose
cosine passes a threshold lend their answers to the extractive answer's vote, as a kNN prior (Khandelwal
et al. 2020's kNN-LM; RePAQ, Lewis et al. 2021, answers from such question-answer pairs alone). The
answer stays extractive: a memory answer is voted for only where it is an indexed phrase of one of
the question's top passages (`Searcher`). Its gain comes from the questions that paraphrase a training
question, and reports should say so (docs/notes/retrieval.md, "The answer memory").

    DIR/manifest.json    {"key": {"question_encoder", "sets"}, "format", "questions", "dim", "files": {...}}
    DIR/vectors.npy      float16, one row a question
    DIR/questions.jsonl  {"id", "question", "answers"} a line, in row order
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from odqa.common.artifact import build_dir, read_manifest
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError, check_checksums, parse_json, read_text, write_jsonl
from odqa.common.metrics.answers import normalize_answer
from odqa.common.questions import Question
from odqa.common.results import Neighbour, Phrase
from odqa.common.timings import stage
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_model import DensePhraseModel, question_encoder_hash, question_vectors_of

FORMAT = 1


def question_vectors(q_start: np.ndarray, q_end: np.ndarray) -> np.ndarray:
    """One vector a question from its start and end vectors: [start; end], L2-normalised, float32."""
    v = np.concatenate([q_start, q_end], axis=1).astype(np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def memory_answers(q: Question) -> list[str]:
    """The strings a memory question lends: its answers and, for NQ, their untokenised forms ("July 5,
    2018", where DPR's are "July 5 , 2018"), which are the ones a passage holds."""
    out = []
    for a in list(q.answers) + list(q.extra.get("answers_raw") or []):
        a = a.strip()
        if a and a not in out:
            out.append(a)
    return out


class AnswerMemory:
    """Questions with answers, found by their question vectors (`neighbours`)."""

    def __init__(self, directory: str | os.PathLike):
        self.dir = Path(directory)
        manifest = read_manifest(self.dir)
        if manifest is None or manifest.get("format") != FORMAT:
            raise InputError(f"{self.dir} is not an answer memory (no manifest.json of format {FORMAT}): "
                             f"build it with `odqa build-memory`")
        check_checksums(self.dir, manifest, "answer memory", reads=["vectors.npy", "questions.jsonl"])
        self.manifest = manifest
        self.vectors = np.load(self.dir / "vectors.npy")
        # A row is parsed when it is a neighbour: `odqa ask` reads a handful of the 17k the demo keeps.
        self._lines = [line for line in read_text(self.dir / "questions.jsonl").split("\n") if line.strip()]
        if len(self._lines) != len(self.vectors) or self.vectors.shape[1:] != (manifest["dim"],):
            raise InputError(f"{self.dir}: corrupt answer memory (questions.jsonl and vectors.npy disagree); rebuild it")
        self.vectors = self.vectors.astype(np.float32)   # stored in half the bytes; compared in float32

    def row(self, r: int) -> dict:
        """Row r's {"id", "question", "answers"}."""
        obj = parse_json(self._lines[r], f"{self.dir / 'questions.jsonl'}:{r + 1}")
        if not isinstance(obj, dict) or not isinstance(obj.get("question"), str) or not isinstance(obj.get("answers"), list):
            raise InputError(f"{self.dir / 'questions.jsonl'}:{r + 1}: not a memory question; rebuild the memory")
        return obj

    @property
    def question_encoder(self) -> str:
        """The hash of the question encoders its vectors came from (`phrase_model.question_encoder_hash`)."""
        return self.manifest["key"]["question_encoder"]

    def __len__(self) -> int:
        return len(self.vectors)

    @stage("memory")
    def neighbours(self, vectors: np.ndarray, count: int, threshold: float) -> list[list[Neighbour]]:
        """Each question's (rows of `question_vectors`) nearest `count` memory questions whose cosine is
        at least `threshold`, nearest first."""
        out = []
        for a in range(0, len(vectors), 256):   # 256 x 17k similarities at a time
            sims = vectors[a:a + 256] @ self.vectors.T
            n = min(count, len(self))
            top = np.argpartition(-sims, n - 1, axis=1)[:, :n]
            top_sims = np.take_along_axis(sims, top, 1)
            order = np.argsort(-top_sims, axis=1, kind="stable")
            top, top_sims = np.take_along_axis(top, order, 1), np.take_along_axis(top_sims, order, 1)
            kept = top_sims >= threshold   # compared in float32, as the similarities are
            for rows, similarities, keep in zip(top.tolist(), top_sims.tolist(), kept.tolist()):
                out.append([Neighbour(row["question"], tuple(row["answers"]), s)
                            for r, s, k in zip(rows, similarities, keep) if k for row in [self.row(r)]])
        return out


@stage("memory")
def memory_votes(neighbours: list[Neighbour], hits: list, weight: float, indexed_phrase) -> list[tuple[Phrase, float]]:
    """The memory's votes for the extractive answer: each neighbour votes once for each of its distinct
    answer strings (as exact match compares them) with `weight` x cosine, for the answer as an indexed
    phrase of the highest-ranked of `hits` that holds it (`indexed_phrase(row, answer)`, phrase
    search's); an answer that no hit holds as a phrase gets no vote."""
    votes, found = [], {}
    for nb in neighbours:
        seen = set()
        for answer in nb.answers:
            key = normalize_answer(answer)
            if not key or key in seen:
                continue
            if key not in found:
                found[key] = next((p for h in hits if h.phrase and (p := indexed_phrase(h.row, answer))), None)
            if found[key] is not None:
                seen.add(key)
                votes.append((found[key], weight * nb.similarity))
    return votes


def memory_sets(directory: str | os.PathLike) -> list[str]:
    """The question sets the memory at `directory` was built from (none when it is not one)."""
    manifest = read_manifest(directory)
    return list(manifest["key"]["sets"]) if manifest and "key" in manifest else []


def build_memory(model_dir: str | os.PathLike, questions: list[Question], sets: list[str],
                 out_dir: str | os.PathLike, batch_size: int = 64) -> dict:
    """Encode `questions` (from the question sets `sets`) with the question encoders of the phrase model
    at `model_dir` and write the memory to `out_dir`, atomically; returns its manifest. Questions whose
    answers are regular expressions (CuratedTREC) cannot be looked up in a passage and are left out."""
    questions = [q for q in questions if not q.regex]
    if not questions:
        raise InputError(f"no questions with plain answers in {', '.join(map(str, sets))}: an answer memory needs some")
    device = pick_device()
    # in the dtype the searcher encodes its questions in, so that a memory question asked again meets itself
    model = DensePhraseModel.from_pretrained(model_dir, questions_only=True).to(device, search_dtype(device)).eval()
    q_start, q_end = question_vectors_of(model, load_tokenizer(model_dir), [q.question for q in questions],
                                         batch_size, device)
    vectors = question_vectors(q_start, q_end)
    key = {"question_encoder": question_encoder_hash(model_dir), "sets": [str(s) for s in sets]}
    with build_dir(out_dir, key, format=FORMAT, questions=len(questions), dim=int(vectors.shape[1])) as (tmp, manifest):
        np.save(tmp / "vectors.npy", vectors.astype(np.float16))
        write_jsonl(tmp / "questions.jsonl", ({"id": q.id, "question": q.question, "answers": memory_answers(q)}
                                              for q in questions))
    return manifest
