"""Question sets and corpora as rows of Hugging Face `datasets`: a hub dataset, or a local JSON, CSV,
TSV or Parquet file, plain or compressed (.gz, .bz2, .xz).

JSON is read here (an array of objects, or one object a line, as `datasets` reads it): pyarrow's JSON
reader, which `datasets` uses, crashed the process on random bytes. A hub dataset is named `hf:NAME[:CONFIG][@SPLIT]`: `hf:nq_open`, `hf:trivia_qa:rc.nocontext@validation`,
`hf:wiki_dpr:psgs_w100.nq.no_index@train`. NAME may also be a local directory in the hub's layout
(`data/validation-00000-of-00001.parquet`). Rows are streamed: a 21M-passage corpus is never held,
nor copied into the datasets cache.

Rows are read by the field names of the field's datasets:
  questions  question: "question" (nq_open, trivia_qa, web_questions, squad) or "input" (KILT);
             answers: "answer" (nq_open's list; trivia_qa's {"aliases", "value"}), "answers" (a list,
             SQuAD's {"text": [...]}, or in a CSV a JSON or Python list), or "output" (KILT's
             [{"answer"}]); id: "id", "question_id" or "qid".
  passages   id: "id", "_id", "docid" or "pid"; title: "title"; text: "text" or "contents" (pyserini's).
"""
from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path

from odqa.common.io import InputError, parse_json, plain_suffix, read_jsonl, require_file, text_lines

HUB = "hf:"
BUILDERS = {".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}


def is_hub(spec: str | os.PathLike) -> bool:
    return str(spec).startswith(HUB)


def is_table(path: str | os.PathLike) -> bool:
    """A local file `datasets` reads here: JSON (an array or an object of columns), CSV, TSV, Parquet."""
    return plain_suffix(path) in (".json", ".csv", ".tsv", ".parquet")


def hub_parts(spec: str, default_split: str) -> tuple[str, str | None, str]:
    """`hf:NAME[:CONFIG][@SPLIT]` -> (NAME, CONFIG or None, SPLIT)."""
    body, _, split = spec[len(HUB):].partition("@")
    name, _, config = body.partition(":")
    if not name:
        raise InputError(f"{spec!r}: a hub dataset is hf:NAME[:CONFIG][@SPLIT]")
    return name, config or None, split or default_split


def hub_name(spec: str, default_split: str) -> str:
    """A short name for reports: `hf:trivia_qa:rc.nocontext@validation` -> trivia_qa-validation."""
    name, _, split = hub_parts(spec, default_split)
    return f"{Path(name).name}-{split}"


def rows(spec: str | os.PathLike, default_split: str = "train") -> Iterator[tuple[int, dict]]:
    """(row number from 1, row) of a hub dataset or a local table file, streamed."""
    from datasets import load_dataset
    if is_hub(spec):
        name, config, split = hub_parts(str(spec), default_split)
        kwargs = {"path": name, "name": config, "split": split}
    else:
        path = require_file(spec, "a data file")
        suffix = plain_suffix(path)
        if suffix in (".json", ".jsonl"):
            yield from _json_rows(path)
            return
        if suffix not in BUILDERS:
            raise InputError(f"{path}: not a file `datasets` reads here (JSON, JSONL, CSV, TSV or Parquet, plain or "
                             f"compressed)")
        kwargs = {"path": BUILDERS[suffix], "data_files": str(path), "split": "train",
                  **({"delimiter": "\t"} if suffix == ".tsv" else {})}
    try:
        dataset = load_dataset(streaming=True, **kwargs)
        for i, row in enumerate(dataset, 1):
            yield i, row
    except Exception as e:   # datasets raises many kinds: an unreachable hub, a missing split, a bad file
        raise InputError(f"{spec}: `datasets` could not read it ({type(e).__name__}: {str(e).strip()[:300]})") from None


def _json_rows(path: Path) -> Iterator[tuple[int, dict]]:
    first = next((line for _, line in text_lines(path) if line.strip()), "")
    if not first.lstrip().startswith("["):
        yield from read_jsonl(path)
        return
    data = parse_json("".join(line for _, line in text_lines(path)), str(path), whole_file=True)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON array of objects, or one object a line")
    for i, row in enumerate(data, 1):
        if not isinstance(row, dict):
            raise InputError(f"{path}:{i}: expected a JSON object, got {type(row).__name__}")
        yield i, row


def question_fields(row: dict, where: str) -> dict:
    """{"id", "question", "answers"} of a question row in any of the field's layouts."""
    question = next((row[k] for k in ("question", "input", "query") if isinstance(row.get(k), str)), None)
    if question is None:
        raise InputError(f"{where}: no question field (\"question\", or KILT's \"input\") among {sorted(row)[:8]}")
    answers = _answers(row, where)
    qid = next((row[k] for k in ("id", "question_id", "qid") if row.get(k) not in (None, "")), None)
    return {"question": question, "answers": answers, **({"id": str(qid)} if qid is not None else {})}


def _answers(row: dict, where: str) -> list[str]:
    if "output" in row and isinstance(row["output"], list):   # KILT
        return [o["answer"] for o in row["output"] if isinstance(o, dict) and isinstance(o.get("answer"), str) and o["answer"]]
    value = row.get("answers", row.get("answer"))
    if isinstance(value, dict):
        if isinstance(value.get("aliases"), list):   # trivia_qa: the aliases, the answer's own value among them
            aliases = [a for a in value["aliases"] if isinstance(a, str)]
            return aliases + [value["value"]] if isinstance(value.get("value"), str) and value["value"] not in aliases \
                else aliases
        value = value.get("text", value.get("value"))   # SQuAD
    if isinstance(value, str):   # a CSV cell: a JSON or Python list, or one answer
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except (ValueError, RecursionError):
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    raise InputError(f"{where}: the answers {text[:80]!r} are not a list") from None
        else:
            value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(a, str) for a in value):
        raise InputError(f"{where}: no answers (\"answer\", \"answers\" or KILT's \"output\") as a list of strings")
    return list(value)


def passage_fields(row: dict, where: str) -> tuple[str, str, str]:
    """(id, title, text) of a passage row."""
    pid = next((row[k] for k in ("id", "_id", "docid", "pid") if row.get(k) not in (None, "")), None)
    text = next((row[k] for k in ("text", "contents") if isinstance(row.get(k), str)), None)
    title = row.get("title", "")
    if pid is None or text is None or not isinstance(title, str):
        raise InputError(f"{where}: a passage needs an id (\"id\", \"_id\", \"docid\"), a \"text\" (or \"contents\") "
                         f"string and a \"title\" string, got fields {sorted(row)[:8]}")
    return str(pid), title, text
