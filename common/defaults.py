"""The default pipeline: the models and indexes `odqa demo` built last, so that later commands
(`retrieve --retriever phrase`, `ask`, `serve`, `run`, `tune-lambda`) need no paths, and the
supervision it trained on, which the training commands read when no `odqa supervise` output is there.

    $ODQA_HOME/pipeline.json   {"corpus", "supervision", "phrase_model", "phrase_index", "doc_model",
                                "doc_index", "reranker", "memory", "reader", "recorded_by", "updated"}

A flag that names a path always wins (`odqa.system.pipeline.resolve_parts` fills the others). A
default that is needed but missing is refused with one line that says which command makes it.
"""
from __future__ import annotations

import time
from pathlib import Path

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


def default_pipeline() -> dict[str, Path]:
    """The recorded artifacts that still exist on disk."""
    path = pipeline_file()
    if not path.exists():
        return {}
    recorded = read_json(path)
    return {k: Path(v) for k, v in recorded.items() if k in ARTIFACTS and v and Path(v).exists()}


def default_path(name: str, pipeline: dict[str, Path] | None = None) -> Path:
    """The default pipeline's `name` (from `pipeline`, when already read)."""
    flag, what = ARTIFACTS[name]
    path = (default_pipeline() if pipeline is None else pipeline).get(name)
    if path is None:
        raise InputError(f"no {what} given and no default one: pass {flag}, or run `odqa demo` to build the "
                         f"default pipeline ({pipeline_file()})")
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
    recorded = read_json(path) if path.exists() else {}
    for k, v in (forget or {}).items():
        if recorded.get(k) == str(Path(v).resolve()):
            del recorded[k]
    recorded.update({k: str(Path(v).resolve()) for k, v in paths.items()})
    if settings is not None:
        recorded["settings"] = settings
    recorded.update(recorded_by=by, updated=time.strftime("%Y-%m-%dT%H:%M:%S"))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, recorded)


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
