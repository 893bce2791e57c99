"""The product in one object: a question goes through one retrieval and comes back with two answers.

    import odqa
    qa = odqa.load()                       # the pipeline `odqa demo` built last, or a pipeline.json
    a = qa.ask("who wrote hamlet", k=10)   # Answer: .extractive (a Phrase), .generated, .passages
    qa.search(["who wrote hamlet"], k=5, unit="document")   # [[Document, ...]]
    qa.read("who wrote hamlet", a.passages[:3])             # the reader's answer over those passages

One phrase search (behind the document pre-filter when the searcher has one) yields both the top
passage's phrase, the extractive answer, and the top-k passages, which the FiD reader reads to
generate the other answer. With an answer memory, `Answer.memory` lists the training questions whose
answers the extractive answer's vote consulted. Timings are per batch, in milliseconds: retrieving,
reading, and each stage of them (`common/timings.py`).

`assemble` is the one place a `Pipeline` is made: from the parts named (a command's flags, a recipe's
files), the default pipeline's record for those not named, its settings, and overrides. `odqa.load`,
`ask`, `serve`, `run`, `retrieve --retriever phrase`, `tune-lambda` and the recipe all call it; the
searcher and the reader load on first use.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Iterable, Sequence

from odqa.common.device import pick_device
from odqa.common.io import InputError
from odqa.common.questions import checked_question
from odqa.common.results import Answer, Passage
from odqa.common.settings import flat_names, updated
from odqa.common.timings import recording
from odqa.reader.args import ReaderSettings
from odqa.reader.fid_data import FiDExample
from odqa.retriever.search_config import SearchConfig
from odqa.system.args import PipelineParts

MAX_K = 100
SEARCH_SETTINGS = tuple(flat_names(SearchConfig))
READER_SETTINGS = tuple(flat_names(ReaderSettings))
UNITS = ("phrase", "passage", "document")


def split_settings(settings: dict) -> tuple[dict, dict]:
    """(search settings, reading settings) of `settings`, flat names that name nothing else."""
    unknown = set(settings) - set(SEARCH_SETTINGS) - set(READER_SETTINGS)
    if unknown:
        raise InputError(f"unknown settings: {', '.join(sorted(unknown))} (search: {', '.join(SEARCH_SETTINGS)}; "
                         f"reader: {', '.join(READER_SETTINGS)})")
    return ({k: v for k, v in settings.items() if k in SEARCH_SETTINGS},
            {k: v for k, v in settings.items() if k in READER_SETTINGS})


class Pipeline:
    """A phrase searcher and a FiD reader over the parts `assemble` resolved, each loaded on first use
    (or given loaded: `searcher`, `reader` as (model, tokenizer), to share them), searching and reading
    by `search` and `reading`."""

    def __init__(self, parts: PipelineParts, search: SearchConfig, reading: ReaderSettings, device: str | None = None,
                 *, searcher=None, reader: tuple | None = None):
        self.parts, self.search_config, self.settings = parts, search, reading
        self.device = pick_device(device)
        self._searcher, self._reader = searcher, reader

    @property
    def searcher(self):
        if self._searcher is None:
            from odqa.common.paths import default_corpus
            from odqa.retriever.searcher import Searcher
            p = self.parts
            self._searcher = Searcher.open(p.index, p.model, p.corpus or default_corpus(), p.doc_index, p.doc_model,
                                           self.search_config, reranker=p.reranker, memory=p.memory)
        return self._searcher

    @property
    def reader(self) -> tuple:
        """(model, tokenizer) of the FiD reader."""
        if self._reader is None:
            from odqa.reader.read import in_reading_dtype, load_reader
            if self.parts.reader is None:
                raise InputError("this pipeline has no FiD reader: give one (--reader, or a record with one)")
            model, tokenizer = load_reader(self.parts.reader, self.device)
            self._reader = in_reading_dtype(model, self.device), tokenizer
        return self._reader

    def loaded(self) -> "Pipeline":
        """This pipeline with its searcher and reader loaded now (a server, `odqa.load`: a damaged part is
        named before the first question)."""
        from odqa.common.device import keep_freed_memory
        from odqa.reader.read import check_lengths
        keep_freed_memory()
        self.searcher   # noqa: B018
        check_lengths(self.reader[0], self.settings)
        return self

    def _with(self, overrides: dict):
        """The searcher and reader settings of one call: this pipeline's, with `overrides` (any of
        `SearchConfig`'s or `ReaderSettings`' settings, by name) in their place."""
        search, read = split_settings(overrides)
        return (self.searcher.with_settings(**search) if search else self.searcher,
                updated(self.settings, read) if read else self.settings)

    def ask(self, question: str | Sequence[str], k: int = 10, **overrides) -> Answer | list[Answer]:
        """The answers to one question (an `Answer`) or to a list of them (a list), from the top k
        passages; `overrides` change search or reader settings for this call only."""
        from odqa.reader.read import check_lengths, generate
        single = isinstance(question, str)
        questions = _questions(question)
        _check_k(k)
        if not questions:
            return []
        searcher, s = self._with(overrides)
        check_lengths(self.reader[0], s)   # before the search, not after it
        with recording() as stages:
            t0 = time.perf_counter()
            results = searcher.search(questions, k, unit="passage")
            t1 = time.perf_counter()
            examples = [FiDExample(id=str(i), question=q, answers=[],
                                   passages=[(h.unit.title, h.unit.text) for h in r.hits],
                                   phrases=[(h.phrase.text, h.phrase.score) if h.phrase else None for h in r.hits])
                        for i, (q, r) in enumerate(zip(questions, results))]
            generated = generate(*self.reader, examples, [k], s, self.device)[k]
            t2 = time.perf_counter()
        timings = {"retrieve_ms": 1000 * (t1 - t0), "read_ms": 1000 * (t2 - t1), "questions_in_batch": len(questions),
                   "stages_ms": {name: 1000 * seconds for name, seconds in stages.items()}}
        answers = [Answer(question=q, extractive=r.extractive, generated=g, passages=tuple(h.unit for h in r.hits),
                          memory=tuple(r.memory or ()), timings=timings)
                   for q, r, g in zip(questions, results, generated)]
        return answers[0] if single else answers

    def answer(self, questions: list[str], k: int = 10, **overrides) -> list[dict]:
        """`ask` as JSON-ready dicts (`Answer.to_dict`), as the server returns them."""
        return [a.to_dict() for a in self.ask(list(questions), k, **overrides)]

    def search(self, questions: str | Sequence[str], k: int = 10, unit: str = "passage", **overrides) -> list:
        """The top k phrases, passages or documents (`unit`) of one question (a list of them), or of each
        of a list of questions (a list of lists), best first."""
        if unit not in UNITS:
            raise InputError(f"unit must be one of {', '.join(UNITS)}, not {unit!r}")
        single = isinstance(questions, str)
        qs = _questions(questions)
        _check_k(k)
        if not qs:
            return []
        searcher, _ = self._with(overrides)
        results = searcher.search(qs, k, unit=unit)
        found = [r.phrases if unit == "phrase" else [h.unit for h in r.hits] for r in results]
        return found[0] if single else found

    def read(self, question: str, passages: Sequence[Passage | tuple[str, str] | str], **overrides) -> str:
        """The reader's answer to `question` over `passages`: `Passage`s, (title, text) pairs or texts."""
        from odqa.reader.read import generate
        question = checked_question(question)
        if isinstance(passages, (str, Passage)) or not isinstance(passages, Sequence):
            raise TypeError(f"passages must be a list of passages, not {type(passages).__name__}")
        if not passages:
            raise InputError("read needs at least one passage")
        if len(passages) > MAX_K:
            raise InputError(f"read reads at most {MAX_K} passages, not {len(passages)}")
        _, s = self._with(overrides)
        pairs = [_pair(p, i) for i, p in enumerate(passages)]
        example = FiDExample(id="0", question=question, answers=[], passages=pairs)
        if s.decoding == "phrases":   # no phrase scores come with given passages
            s = dataclasses.replace(s, decoding="spans")
        (answer,) = generate(*self.reader, [example], [len(pairs)], s, self.device)[len(pairs)]
        return answer


def _questions(question) -> list[str]:
    """`ask`'s and `search`'s question argument, one string or a list of them, each checked."""
    if isinstance(question, str):
        return [checked_question(question)]
    if not isinstance(question, Iterable) or isinstance(question, (bytes, dict)):
        raise TypeError(f"question must be a string or a list of strings, not {type(question).__name__}")
    return [checked_question(q, f"question {i}") for i, q in enumerate(question)]


def _check_k(k) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be a whole number (an int) in 1..{MAX_K}, not {k!r}")
    if not 1 <= k <= MAX_K:
        raise InputError(f"k must be in 1..{MAX_K}, not {k}")


def _pair(passage, i: int) -> tuple[str, str]:
    """One passage given to `read` as the (title, text) the reader reads."""
    if isinstance(passage, Passage):
        return passage.title, passage.text
    if isinstance(passage, str):
        return "", passage
    if isinstance(passage, tuple) and len(passage) == 2 and all(isinstance(x, str) for x in passage):
        return passage
    raise TypeError(f"passages[{i}] must be a Passage, a text or a (title, text) pair of strings, not {passage!r:.80}")


def pipeline_record(name_or_path: str | os.PathLike = "default") -> tuple[Path, dict[str, Path], dict]:
    """(the record's file, its artifacts, its settings): "default" is $ODQA_HOME/pipeline.json (what
    `odqa demo` records); a directory is its pipeline.json (a demo's run directory has one); a file is
    read as is. A recorded path that is gone is refused by name: a pipeline is not loaded without a
    part. "settings", where the record has it, holds search and reading settings (`SearchConfig`'s and
    `ReaderSettings`', by name) that the pipeline runs with."""
    from odqa.common.defaults import ARTIFACTS, pipeline_file, read_record
    path = pipeline_file() if str(name_or_path) == "default" else Path(name_or_path).expanduser()
    if path.is_dir():
        path = path / "pipeline.json"
    if not path.is_file():
        hint = "run `odqa demo` to build the default pipeline" if str(name_or_path) == "default" else \
            "give the default, a pipeline.json, or a directory holding one"
        raise InputError(f"no pipeline record at {path}: {hint}")
    recorded, settings = read_record(path)
    for name in ("phrase_index", "phrase_model", "reader", "corpus"):
        if name not in recorded:
            raise InputError(f"{path} records no {ARTIFACTS[name][1]}")
    gone = [f"{ARTIFACTS[k][1]} ({v})" for k, v in recorded.items() if k != "supervision" and not v.exists()]
    if gone:
        raise InputError(f"{path} records what is no longer there: {', '.join(gone)}")
    recorded_settings(path, settings)
    return path, recorded, settings


def recorded_settings(path: Path, settings: dict) -> tuple[dict, dict]:
    """(search settings, reading settings) of a pipeline record's "settings", refused by name if it holds
    anything else."""
    try:
        return split_settings(settings)
    except InputError as e:
        raise InputError(f"{path}: \"settings\" holds what is not a search or reading setting: {e}") from None


def resolve_parts(parts: PipelineParts, recorded: dict[str, Path], reader: bool) -> tuple[PipelineParts, bool, bool]:
    """(`parts` with the record's in place of those not given, whether the phrase index is the record's,
    whether the reader is). The pre-filter, the reranker and the corpus come along only with the
    record's phrase index: an index named is searched as named, and `no_prefilter` / `no_reranker`
    leave those out. The answer memory comes along with the record's phrase model (its vectors are that
    model's questions), unless `no_memory`. The reader, with `reader`, which also requires one."""
    from odqa.common.defaults import default_path

    def part(name: str) -> str:   # a recorded part that is gone is refused by name, never left out
        return str(default_path(name, recorded))
    own_index, own_model = parts.index is None, parts.model is None
    found = {"index": parts.index or part("phrase_index"), "model": parts.model or part("phrase_model")}
    if own_index and parts.doc_index is None and not parts.no_prefilter and {"doc_index", "doc_model"} <= set(recorded):
        found.update(doc_index=part("doc_index"), doc_model=part("doc_model"))
    if own_index and parts.reranker is None and not parts.no_reranker and "reranker" in recorded:
        found["reranker"] = part("reranker")
    if own_model and parts.memory is None and not parts.no_memory and "memory" in recorded:
        found["memory"] = part("memory")
    if own_index and parts.corpus is None and "corpus" in recorded:
        found["corpus"] = part("corpus")
    own_reader = reader and parts.reader is None
    if own_reader:
        found["reader"] = part("reader")
    return dataclasses.replace(parts, **found), own_index, own_reader


def assemble(parts: PipelineParts | None = None, search: SearchConfig | None = None,
             reading: ReaderSettings | None = None, overrides: dict | None = None, *,
             record: str | os.PathLike | None = "default", reader: bool = True, device: str | None = None) -> Pipeline:
    """The pipeline of `parts` (a `PipelineParts`, the default pipeline's where a part is not named) and
    of its settings: `search` and `reading` where given whole, else the record's settings (the search
    ones with its phrase index, the reading ones with its reader) over the settings' own defaults; then
    `overrides` (settings by name) over either. `record`: "default" (the default pipeline's record,
    $ODQA_HOME/pipeline.json, where there is one), a pipeline.json or a directory holding one, or None
    (the parts are all named). With `reader` the pipeline must have one."""
    from odqa.common.defaults import pipeline_file, read_record
    parts, recorded, settings, path, own_index, own_reader = parts or PipelineParts(), {}, {}, None, False, False
    if record is not None:
        path = pipeline_file() if str(record) == "default" else Path(record)
        path = path / "pipeline.json" if path.is_dir() else path
        if path.exists():
            recorded, settings = read_record(path)
        elif str(record) != "default":
            raise InputError(f"no pipeline record at {path}: give a pipeline.json, or a directory holding one")
        parts, own_index, own_reader = resolve_parts(parts, recorded, reader)
    elif reader and parts.reader is None:
        raise InputError("a pipeline needs a FiD reader: give one (--reader)")
    from_search, from_read = recorded_settings(path, settings) if settings else ({}, {})
    extra_search, extra_read = split_settings(overrides or {})
    try:
        search = updated(search or updated(SearchConfig(), from_search if own_index else {}), extra_search)
        reading = updated(reading or updated(ReaderSettings(), from_read if own_reader else {}), extra_read)
    except InputError as e:
        raise InputError(f"{path} with {settings}: {e}" if path is not None and settings else str(e)) from None
    return Pipeline(parts, search, reading, device)


def load(name_or_path: str | os.PathLike = "default", device: str | None = None, **settings) -> Pipeline:
    """The pipeline a record names (`pipeline_record`), its searcher and reader loaded, with the record's
    settings and then `settings` (search or reading settings, as `Pipeline.ask` takes them) as its own."""
    path, _, _ = pipeline_record(name_or_path)
    split_settings(settings)   # load's own keywords: refused before the record's name the file
    return assemble(PipelineParts(), overrides=settings, record=path, device=device).loaded()
