"""Question sets: JSONL lines `{"id", "question", "answers", "regex"}`.

`regex` is true where the answers are regular expressions (CuratedTREC). NQ lines also carry
`answers_raw`, the untokenised answers of pyserini's `topics.nq.*` (DPR's are PTB-tokenised:
"July 5 , 2018"). A set is named by a path or by one of the names the data pack provides.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from odqa.common.io import InputError, read_jsonl
from odqa.common.paths import questions_dir

# name -> (file inside the anserini jar, format, raw-answers file)
QUESTION_SETS = {
    "nq-dev": ("topics.dpr.nq.dev.txt", "tsv", "topics.nq.dev.txt"),
    "nq-test": ("topics.dpr.nq.test.txt", "tsv", "topics.nq.test.txt"),
    "tqa-dev": ("topics.dpr.trivia.dev.txt", "tsv", None),
    "tqa-test": ("topics.dpr.trivia.test.txt", "tsv", None),
    "squad-test": ("topics.dpr.squad.test.txt", "jsonl", None),
    "wq-test": ("topics.dpr.wq.test.txt", "jsonl", None),
    "curated-test": ("topics.dpr.curated.test.txt", "jsonl", None),
}
REGEX_SETS = {"curated-test"}


@dataclass
class Question:
    id: str
    question: str
    answers: list[str]
    regex: bool = False
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"id": self.id, "question": self.question, "answers": self.answers, "regex": self.regex, **self.extra}


def split_limit(spec: str | os.PathLike, limit: int | None = None) -> tuple[str | os.PathLike, int | None]:
    """`tqa-test:3000` -> (`tqa-test`, 3000), or `limit` where that is smaller; a spec without `:N`, or
    a file that exists under the whole spec, -> (spec, limit)."""
    head, sep, tail = str(spec).rpartition(":")
    if not sep or not head or not tail.isdigit() or Path(spec).exists():
        return spec, limit
    if int(tail) < 1:
        raise InputError(f"question set {str(spec)!r}: the number after ':' must be at least 1")
    return head, int(tail) if limit is None else min(limit, int(tail))


def question_set_path(name_or_path: str | os.PathLike) -> Path:
    path = Path(name_or_path)
    if path.suffix or path.exists() or os.sep in str(name_or_path):
        return path
    if name_or_path not in QUESTION_SETS:
        raise InputError(f"unknown question set {name_or_path!r}: give a JSONL path or one of {', '.join(QUESTION_SETS)}")
    path = questions_dir() / f"{name_or_path}.jsonl"
    if not path.exists():
        raise InputError(f"question set {name_or_path!r} not found at {path}: run `odqa data fetch` first")
    return path


def question_set_name(name_or_path: str | os.PathLike) -> str:
    """A short name for reports: the set's name, or the file's stem (without a `:N` limit)."""
    return Path(split_limit(name_or_path)[0]).stem


def parse_question(obj: dict, where: str) -> Question:
    question = obj.get("question")
    answers = obj.get("answers")
    if not isinstance(question, str) or not question.strip():
        raise InputError(f"{where}: empty or missing \"question\"")
    if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
        raise InputError(f"{where}: \"answers\" must be a list of strings")
    qid = obj.get("id")
    extra = {k: v for k, v in obj.items() if k not in ("id", "question", "answers", "regex")}
    return Question(id=str(qid) if qid is not None else "", question=question.strip(), answers=answers,
                    regex=bool(obj.get("regex", False)), extra=extra)


def load_questions(name_or_path: str | os.PathLike, limit: int | None = None) -> list[Question]:
    """The set's questions; the first `limit`, or fewer where the spec's own `:N` says so."""
    name_or_path, limit = split_limit(name_or_path, limit)
    path = question_set_path(name_or_path)
    out = []
    for lineno, obj in read_jsonl(path):
        q = parse_question(obj, f"{path}:{lineno}")
        q.id = q.id or f"{path.stem}-{len(out)}"
        out.append(q)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError(f"{path}: no questions")
    return out


def split_of(question: str, validation_percent: float) -> str:
    """"train" or "validation" by a hash of the question text: the same on every machine and run, so
    `odqa supervise` and `odqa train-reader` hold out the same dev questions."""
    bucket = int(hashlib.md5(question.strip().lower().encode("utf-8")).hexdigest(), 16) % 10_000
    return "validation" if bucket < validation_percent * 100 else "train"
