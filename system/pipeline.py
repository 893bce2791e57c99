"""The product in one object: a question goes through one retrieval and comes back with two answers.

    import odqa
    qa = odqa.load()                       # the pipeline `odqa demo` built last, or a pipeline.json
    a = qa.ask("who wrote hamlet", k=10)   # Answer: .extractive (a Phrase), .generated, .passages
    qa.search(["who wrote hamlet"], k=5, unit="document")   # [[Document, ...]]
    qa.read("who wrote hamlet", a.passages[:3])             # the reader's answer over those passages

One phrase search (behind the document pre-filter when the searcher has one) yields both the top
passage's phrase, the extractive answer, and the top-k passages, which the FiD reader reads to
generate the other answer. With an answer memory, `Answer.memory` lists the training questions whose
answers the extractive answer's vote consulted. Timings are per batch, in milliseconds, for each stage.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Sequence

from odqa.common.device import pick_device
from odqa.common.io import InputError
from odqa.common.results import Answer, Document, Neighbour, Passage, Phrase
from odqa.reader.args import ReaderSettings
from odqa.reader.fid_data import FiDExample
from odqa.reader.read import generate_answers, load_reader
from odqa.retriever.args import SearchConfig
from odqa.retriever.searcher import UNITS, open_searcher, top_phrase
from odqa.system.args import SearchParts

MAX_K = 100


READER_SETTINGS = tuple(f.name for f in dataclasses.fields(ReaderSettings))
SEARCH_SETTINGS = tuple(f.name for f in dataclasses.fields(SearchConfig))


def split_settings(settings: dict) -> tuple[dict, dict]:
    """(search settings, reading settings) of `settings`, which names nothing else."""
    unknown = set(settings) - set(SEARCH_SETTINGS) - set(READER_SETTINGS)
    if unknown:
        raise InputError(f"unknown settings: {', '.join(sorted(unknown))} (search: {', '.join(SEARCH_SETTINGS)}; "
                         f"reader: {', '.join(READER_SETTINGS)})")
    return ({k: v for k, v in settings.items() if k in SEARCH_SETTINGS},
            {k: v for k, v in settings.items() if k in READER_SETTINGS})


def _unit(d: dict, unit: str):
    if unit == "phrase":
        return Phrase.from_dict(d)
    return (Passage if unit == "passage" else Document).from_dict(d)


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

    def _with(self, overrides: dict):
        """The searcher and reader settings of one call: this pipeline's, with `overrides` (any of
        `SearchConfig`'s or `ReaderSettings`' fields) in their place."""
        search, read = split_settings(overrides)
        return (self.searcher.with_settings(**search) if search else self.searcher,
                dataclasses.replace(self.settings, **read) if read else self.settings)

    def ask(self, question: str | Sequence[str], k: int = 10, **overrides) -> Answer | list[Answer]:
        """The answers to one question (an `Answer`) or to a list of them (a list), from the top k
        passages; `overrides` change search or reader settings for this call only."""
        single = isinstance(question, str)
        questions = [question] if single else list(question)
        if not 1 <= k <= MAX_K:
            raise InputError(f"k must be in 1..{MAX_K}, not {k}")
        if not questions:
            return []
        searcher, s = self._with(overrides)
        questions = [q.strip() if isinstance(q, str) else q for q in questions]
        t0 = time.perf_counter()
        results = searcher.search(questions, k, unit="passage")
        t1 = time.perf_counter()
        examples = [FiDExample(id=str(i), question=q, answers=[], passages=[(p["title"], p["text"]) for p in r["passages"]],
                               phrases=[(p["phrase"]["text"], p["phrase"]["score"]) if p.get("phrase") else None
                                        for p in r["passages"]])
                    for i, (q, r) in enumerate(zip(questions, results))]
        generated = generate_answers(self.model, self.tokenizer, examples, k, s.batch_size, s.text_maxlength,
                                     s.max_new_tokens, s.num_beams, self.device, progress=False, decoding=s.decoding)
        t2 = time.perf_counter()
        timings = {"retrieve_ms": 1000 * (t1 - t0), "read_ms": 1000 * (t2 - t1), "questions_in_batch": len(questions)}
        answers = [Answer(question=q, extractive=Phrase.from_dict(top_phrase(r)), generated=g,
                          passages=tuple(map(Passage.from_dict, r["passages"])),
                          memory=tuple(map(Neighbour.from_dict, r.get("memory", ()))), timings=timings)
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
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        searcher, _ = self._with(overrides)
        results = searcher.search(qs, k, unit=unit)
        found = [[_unit(d, unit) for d in r[unit + "s"]] for r in results]
        return found[0] if single else found

    def read(self, question: str, passages: Sequence[Passage | tuple[str, str] | str], **overrides) -> str:
        """The reader's answer to `question` over `passages`: `Passage`s, (title, text) pairs or texts."""
        if not passages:
            raise InputError("read needs at least one passage")
        _, s = self._with(overrides)
        pairs = [(p.title, p.text) if isinstance(p, Passage) else ("", p) if isinstance(p, str) else tuple(p)
                 for p in passages]
        example = FiDExample(id="0", question=question.strip(), answers=[], passages=pairs)
        decoding = "spans" if s.decoding == "phrases" else s.decoding   # no phrase scores come with given passages
        (answer,) = generate_answers(self.model, self.tokenizer, [example], len(pairs), s.batch_size, s.text_maxlength,
                                     s.max_new_tokens, s.num_beams, self.device, progress=False, decoding=decoding)
        return answer


def pipeline_record(name_or_path: str | os.PathLike = "default") -> tuple[Path, dict[str, Path], dict]:
    """(the record's file, its artifacts, its settings): "default" is $ODQA_HOME/pipeline.json (what
    `odqa demo` records); a directory is its pipeline.json (a demo's run directory has one); a file is
    read as is. A recorded path that is gone is refused by name: a pipeline is not loaded without a
    part. "settings", where the record has it, holds search and reading settings (`SearchConfig`'s and
    `ReaderSettings`' fields) that the pipeline runs with."""
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
    search, read = recorded_settings(path, settings)
    return path, recorded, {**search, **read}


def recorded_settings(path: Path, settings: dict) -> tuple[dict, dict]:
    """(search settings, reading settings) of a pipeline record's "settings", refused by name if it holds
    anything else."""
    try:
        return split_settings(settings)
    except InputError as e:
        raise InputError(f"{path}: \"settings\" holds what is not a search or reading setting: {e}") from None


def resolve_parts(parts: SearchParts, reader: bool = False) -> tuple[SearchParts, dict]:
    """`parts` with the default pipeline's in place of those not given, and the settings its record holds
    that come with them: the search settings with its phrase index, the reading settings with its reader
    (with `reader`, which also requires one). The pre-filter, the reranker and the corpus come along only
    with the default phrase index: an index named by a flag is searched as named, and `no_prefilter` /
    `no_reranker` leave those out. The answer memory comes along with the default phrase model (its
    vectors are that model's questions), unless `no_memory`."""
    from odqa.common.defaults import default_path, pipeline_file, read_record
    path = pipeline_file()
    pipeline, settings = read_record(path) if path.exists() else ({}, {})

    def part(name: str) -> str:   # a recorded part that is gone is refused by name, never left out
        return str(default_path(name, pipeline))
    own_index, own_model = parts.index is None, parts.model is None
    found = {"index": parts.index or part("phrase_index"), "model": parts.model or part("phrase_model")}
    if own_index and parts.doc_index is None and not parts.no_prefilter and {"doc_index", "doc_model"} <= set(pipeline):
        found.update(doc_index=part("doc_index"), doc_model=part("doc_model"))
    if own_index and parts.reranker is None and not parts.no_reranker and "reranker" in pipeline:
        found["reranker"] = part("reranker")
    if own_model and parts.memory is None and not parts.no_memory and "memory" in pipeline:
        found["memory"] = part("memory")
    if own_index and parts.corpus is None and "corpus" in pipeline:
        found["corpus"] = part("corpus")
    own_reader = reader and parts.reader is None
    if own_reader:
        found["reader"] = part("reader")
    search, read = recorded_settings(path, settings) if (own_index or own_reader) else ({}, {})
    return dataclasses.replace(parts, **found), {**(search if own_index else {}), **(read if own_reader else {})}


def load(name_or_path: str | os.PathLike = "default", device: str | None = None, **settings) -> Pipeline:
    """The pipeline a record names (`pipeline_record`), its searcher and reader loaded, with the record's
    settings and then `settings` (search or reading settings, as `Pipeline.ask` takes them) as its own."""
    path, r, recorded = pipeline_record(name_or_path)
    split_settings(settings)   # load's own keywords: refused before the record's name the file
    settings = {**recorded, **settings}
    search, read = split_settings(settings)
    try:
        search, reader = SearchConfig(**search), ReaderSettings(**read)
    except InputError as e:
        raise InputError(f"{path} with {settings}: {e}") from None
    both = {"doc_index", "doc_model"} <= set(r)
    searcher = open_searcher(r["phrase_index"], r["phrase_model"], r["corpus"], r["doc_index"] if both else None,
                             r["doc_model"] if both else None, search, reranker=r.get("reranker"), memory=r.get("memory"))
    device = pick_device(device)
    model, tokenizer = load_reader(r["reader"], device)
    return Pipeline(searcher, model, tokenizer, reader, device)
