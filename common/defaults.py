"""The default pipeline: the models and indexes `odqa demo` built last, so that later commands
(`retrieve --retriever phrase`, `ask`, `serve`, `run`, `tune-lambda`) need no paths, and the
supervision it trained on, which the training commands read when no `odqa supervise` output is there.

    $ODQA_HOME/pipeline.json   {"corpus", "supervision", "phrase_model", "phrase_index", "doc_model",
                                "doc_index", "reranker", "memory", "reader", "settings", "recorded_by",
                                "updated"}

A path inside $ODQA_HOME (or beside the record) is stored relative to the record's directory, so a
copied or moved home finds its own files, never the original's. A record is read through its schema
(`PipelineRecord`): the wrong shape is an error naming the file and the field.

A flag that names a path always wins (`odqa.system.pipeline.resolve_parts` fills the others). A
default that is needed but missing is refused with one line that says which command makes it.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from odqa.common.io import InputError, read_json, write_json
from odqa.common.paths import default_corpus, odqa_home

# artifact -> (the flag that overrides it, what it is)
ARTIFACTS = {
    "corpus": ("--corpus", "corpus"),
    "supervision": ("--train-file", "supervision"),
    "phrase_model": ("--model", "phrase model"),
    "phrase_index": ("--index", "phrase index"),
    "doc_model": ("--doc-model", "document encoder"),
    "doc_index": ("--doc-index", "document index"),
    "reranker": ("--reranker", "passage reranker"),
    "memory": ("--memory", "answer memory"),
    "reader": ("--reader", "FiD reader"),
}


def pipeline_file() -> Path:
    return odqa_home() / "pipeline.json"


class PipelineRecord(BaseModel):
    """The schema of a pipeline record: each artifact's path (relative to the record's directory, or
    absolute), the settings it runs with, and who recorded it when."""
    model_config = ConfigDict(extra="forbid", strict=True)
    corpus: str | None = None
    supervision: str | None = None
    phrase_model: str | None = None
    phrase_index: str | None = None
    doc_model: str | None = None
    doc_index: str | None = None
    reranker: str | None = None
    memory: str | None = None
    reader: str | None = None
    settings: dict[str, Any] = {}
    recorded_by: str | None = None
    updated: str | None = None


def read_record(path: Path) -> tuple[dict[str, Path], dict]:
    """(each recorded artifact's path, resolved against the record's directory; the record's settings)
    of a pipeline record, refused by name where it is not valid JSON or not of the schema."""
    raw = read_json(path)
    try:
        record = PipelineRecord.model_validate(raw)
    except ValidationError as e:
        said = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the record'}: {err['msg']}" for err in e.errors()[:3])
        raise InputError(f"{path}: not a pipeline record ({said})") from None
    return ({k: _resolved(v, path.parent) for k in ARTIFACTS if (v := getattr(record, k))}, record.settings)


def _resolved(stored: str, base: Path) -> Path:
    return Path(stored) if Path(stored).is_absolute() else Path(os.path.normpath(base / stored))


def _stored(path: str | Path, base: Path) -> str:
    """`path` as a record in `base` stores it: relative to `base` when inside $ODQA_HOME or inside `base`
    (so the record moves with them), else absolute."""
    path = Path(path).resolve()
    for root in (odqa_home().resolve(), base.resolve()):
        if path == root or root in path.parents:
            return os.path.relpath(path, base.resolve())
    return str(path)


def write_record(path: Path, artifacts: dict[str, str | Path], by: str, settings: dict | None = None,
                 keep: dict | None = None) -> None:
    """Write a pipeline record atomically: `keep` (what it already records, as read) updated with
    `artifacts`, stored relative to the record where they can be."""
    path.parent.mkdir(parents=True, exist_ok=True)
    recorded = {k: _stored(v, path.parent) for k, v in {**(keep or {}), **artifacts}.items()}
    record = PipelineRecord(**recorded, settings=settings or {}, recorded_by=by,
                            updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    write_json(path, record.model_dump(exclude_none=True))


def default_pipeline() -> dict[str, Path]:
    """The default pipeline's recorded artifacts (`default_path` refuses one that is gone, by name)."""
    path = pipeline_file()
    return read_record(path)[0] if path.exists() else {}


def default_path(name: str, pipeline: dict[str, Path] | None = None) -> Path:
    """The default pipeline's `name` (from `pipeline`, when already read)."""
    flag, what = ARTIFACTS[name]
    path = (default_pipeline() if pipeline is None else pipeline).get(name)
    if path is None:
        raise InputError(f"no {what} given and no default one: pass {flag}, or run `odqa demo` to build the "
                         f"default pipeline ({pipeline_file()})")
    if not path.exists():
        raise InputError(f"{pipeline_file()} records the {what} at {path}, which is not there: pass {flag}, or "
                         f"build it again")
    return path


def record_pipeline(paths: dict[str, str | Path], by: str, forget: dict[str, str | Path] | None = None,
                    settings: dict | None = None) -> None:
    """Record (or update) artifacts of the default pipeline; the file is replaced atomically. Each
    artifact of `forget` is taken out where the pipeline still records it at that path. `settings`
    (search and reading settings the pipeline is run with) replace those recorded."""
    unknown = (set(paths) | set(forget or {})) - set(ARTIFACTS)
    if unknown:
        raise ValueError(f"not pipeline artifacts: {sorted(unknown)}")
    path = pipeline_file()
    recorded, old_settings = read_record(path) if path.exists() else ({}, {})
    for k, v in (forget or {}).items():
        if k in recorded and recorded[k].resolve() == Path(v).resolve():
            del recorded[k]
    write_record(path, paths, by, old_settings if settings is None else settings, keep=recorded)


def default_supervision() -> Path:
    """The directory of train.jsonl and validation.jsonl that the training commands read with no flag:
    `odqa supervise`'s output for the default corpus where it exists, else the supervision the last
    `odqa demo` trained on (it keeps its own, in its run directory)."""
    own = default_corpus() / "supervision"
    if (own / "train.jsonl").exists():
        return own
    try:
        return default_pipeline().get("supervision", own)
    except InputError:   # read while building the CLI: a broken record must not break every command
        return own
