"""Question sets: JSONL lines `{"id", "question", "answers", "regex"}`, or DPR's question files
(`nq-test.qa.csv`, pyserini's `topics.dpr.*.txt`): `question<TAB>['answer', ...]` per line; or any
dataset HF `datasets` reads (`common/tables.py`): `hf:nq_open`, `hf:trivia_qa:rc.nocontext@validation`,
or a JSON, Parquet, or headed CSV/TSV file.

`regex` is true where the answers are regular expressions (CuratedTREC). NQ lines also carry
`answers_raw`, the untokenised answers of pyserini's `topics.nq.*` (DPR's are PTB-tokenised:
"July 5 , 2018"). A set is named by a path or by one of the names the data pack provides.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from odqa.common.io import InputError, plain_suffix, read_jsonl, read_text, text_lines
from odqa.common.paths import questions_dir
from odqa.common.tables import hub_name, is_hub, is_table, question_fields, rows

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
DEFAULT_SPLIT = "validation"   # of a hub dataset named without one: open-domain QA evaluates on it
# One asked question (the API, `odqa ask`): TriviaQA's longest is 854 characters, and far longer leaves
# the reader's input no room for its passages, so the answer comes out empty. The server takes 500.
MAX_QUESTION_CHARS = 1000


def checked_question(question, name: str = "question", max_chars: int = MAX_QUESTION_CHARS) -> str:
    """One asked question, stripped, or the named reason it cannot be asked: a TypeError for what is
    not a string, an InputError (a ValueError) for text that is empty, invisible, too long or not
    valid Unicode. Question files are read by `load_questions`, which has its own rules."""
    if not isinstance(question, str):
        raise TypeError(f"{name} must be a string, not {type(question).__name__}")
    question = question.strip()
    if not question:
        raise InputError(f"{name} is empty")
    if len(question) > max_chars:
        raise InputError(f"{name} is longer than {max_chars} characters ({len(question):,})")
    try:
        question.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate: what an argument of invalid UTF-8 decodes to
        raise InputError(f"{name} is not valid text (it holds a lone surrogate)") from None
    if not any(ch.isprintable() and not ch.isspace() for ch in question):
        raise InputError(f"{name} has no visible characters")
    return question


@dataclass
class Question:
    id: str
    question: str
    answers: list[str]
    regex: bool = False
    extra: dict = field(default_factory=dict)


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
        raise InputError(f"unknown question set {name_or_path!r}: give a JSONL or DPR TSV path, or one of "
                         f"{', '.join(QUESTION_SETS)}")
    path = questions_dir() / f"{name_or_path}.jsonl"
    if not path.exists():
        raise InputError(f"question set {name_or_path!r} not found at {path}: run `odqa data fetch` first")
    return path


def question_set_name(name_or_path: str | os.PathLike) -> str:
    """A short name for reports: the set's name, or the file's stem (without a `:N` limit)."""
    spec = split_limit(name_or_path)[0]
    return hub_name(str(spec), DEFAULT_SPLIT) if is_hub(spec) else Path(spec).stem.removesuffix(".json")


def is_dataset(spec: str | os.PathLike) -> bool:
    """Read through `datasets`: a hub spec, JSON, Parquet, or a CSV/TSV whose first line is a header
    naming a "question" column (DPR's .qa.csv has none: it is read as DPR's)."""
    if is_hub(spec):
        return True
    if not is_table(spec) or not Path(spec).is_file():
        return False
    if plain_suffix(spec) not in (".csv", ".tsv"):
        return True
    first = next((line for _, line in text_lines(spec) if line.strip()), "")
    return "question" in {cell.strip().strip('"') for cell in re.split(r"[\t,]", first)}


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


def dpr_rows(text: str, where: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number, question, answers) of DPR's question TSV. Its fields are CSV-quoted (a question
    may hold tabs, doubled quotes and newlines), so csv reads it, and the answers are a Python list
    literal."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t")
    while True:
        try:
            row = next(reader, None)
        except csv.Error as e:      # a NUL byte, a field past csv's size limit
            raise InputError(f"{where}:{reader.line_num}: not DPR's question TSV ({e})") from None
        if row is None:
            return
        if not "".join(row).strip():
            continue
        where_line = f"{where}:{reader.line_num}"
        if len(row) != 2:
            raise InputError(f"{where_line}: expected a JSON object or DPR's question<TAB>['answer', ...], "
                             f"got {len(row)} tab-separated fields")
        try:
            answers = ast.literal_eval(row[1])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):   # what literal_eval raises
            answers = None
        if not isinstance(answers, (list, tuple)) or not all(isinstance(a, str) for a in answers):
            raise InputError(f"{where_line}: the answers must be a Python list of strings, got {row[1][:80]!r}")
        yield reader.line_num, row[0], list(answers)


def question_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, question object) of a JSONL or a DPR TSV file, told apart by the first line."""
    first = next((line for _, line in text_lines(path) if line.strip()), "")
    if first.lstrip().startswith("{") or not first:
        yield from read_jsonl(path)
        return
    for lineno, question, answers in dpr_rows(read_text(path), str(path)):
        yield lineno, {"question": question, "answers": answers}


def load_questions(name_or_path: str | os.PathLike, limit: int | None = None) -> list[Question]:
    """The set's questions; the first `limit`, or fewer where the spec's own `:N` says so."""
    name_or_path, limit = split_limit(name_or_path, limit)
    if is_dataset(name_or_path):
        path = name_or_path
        lines = ((i, question_fields(row, f"{path}:{i}")) for i, row in rows(path, DEFAULT_SPLIT))
    else:
        path = question_set_path(name_or_path)
        lines = question_lines(path)
    stem = question_set_name(path)
    out = []
    for lineno, obj in lines:
        q = parse_question(obj, f"{path}:{lineno}")
        q.id = q.id or f"{stem}-{len(out)}"
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
