"""Corpus formats, the streaming passage builder (`odqa corpus build`), and passage look-up.

Inputs (format detected from the file, or given):
  dpr-tsv     DPR's psgs_w100.tsv: header `id text title`, one passage a line.
  table       passages as rows HF `datasets` reads (`common/tables.py`): a hub dataset (`hf:wiki_dpr`), or
              a JSON, CSV, TSV or Parquet file, plain or compressed; fields id, title, text (or contents).
  passages    JSONL `{"id", "title", "text"}`.
  documents   JSONL `{"id", "title", "abstract"?, "sections": [{"title", "paragraphs": [...], "sections": [...]}]}`:
              DHR's title tree, document title at the root, section titles inside, text at the leaves.
              Other top-level keys (e.g. "description", "topic") are kept in documents.jsonl.

Outputs in DIR:
  passages.jsonl   {"id", "doc_id", "title", "section", "text", "char_start", "char_end"}; `section` is the
                   path of section titles below the document title, and text == section_text[char_start:char_end]
                   where section_text is the section's paragraphs joined by "\\n" (or the input passage's text).
  documents.jsonl  {"id", "title", "abstract", "toc", "n_passages", ...}; `abstract` is the input's abstract or
                   the document's first passage, `toc` the section titles in pre-order.
  corpus.json      counts, inputs and a fingerprint of passages.jsonl that derived indexes check against.

Passages of a document are written consecutively. Passage-format inputs keep their ids (a passage over
the word bound is cut into `ID-0`, `ID-1`, ...) and consecutive passages with one title form a document
whose id is its first passage's id (DPR's file lists each article's passages together).
"""
from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import sys
import zipfile
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np
from tqdm import tqdm

from odqa.common.io import (
    InputError,
    atomic_path,
    check_checksums,
    parse_json,
    plain_suffix,
    read_json,
    read_jsonl,
    require_file,
    text_lines,
    write_json,
)
from odqa.common.splitter import split_passages
from odqa.common.tables import is_hub, is_table, passage_fields, rows

log = logging.getLogger(__name__)

FORMATS = ("dpr-tsv", "passages", "documents", "table")
DPR_HEADER = ["id", "text", "title"]
MAX_WORDS = 100
csv.field_size_limit(sys.maxsize)


@dataclass
class Unit:
    """A stretch of text that passages never cross: a section, or one input passage."""
    section: list[str]
    text: str
    id_hint: str | None = None  # the input passage's id, where there is one


@dataclass
class SourceDoc:
    id: str
    title: str
    abstract: str | None
    toc: list[str]
    units: list[Unit]
    meta: dict


def detect_format(path: Path) -> str:
    if plain_suffix(path) == ".tsv":
        first = next((line for _, line in text_lines(path)), "")
        return "dpr-tsv" if first.rstrip("\r\n").split("\t") == DPR_HEADER else "table"
    if is_table(path):
        return "table"
    for _, obj in read_jsonl(path):
        return "documents" if "sections" in obj else "passages"
    raise InputError(f"{path}: empty input")


# --- readers -----------------------------------------------------------------------------------

def _read_dpr_tsv(path: Path) -> Iterator[tuple[str, str, str]]:
    reader = csv.reader((line for _, line in text_lines(path)), delimiter="\t")
    header = next(reader, None)
    if header != DPR_HEADER:
        raise InputError(f"{path}:1: expected the header 'id<TAB>text<TAB>title', got {header!r}")
    for row in reader:
        if len(row) != 3:
            raise InputError(f"{path}:{reader.line_num}: expected 3 tab-separated fields, got {len(row)}")
        pid, text, title = row
        if not pid:
            raise InputError(f"{path}:{reader.line_num}: empty passage id")
        yield pid, title, text


def _read_passages_jsonl(path: Path) -> Iterator[tuple[str, str, str]]:
    for lineno, obj in read_jsonl(path):
        pid, title, text = obj.get("id"), obj.get("title"), obj.get("text")
        if pid is None or not isinstance(title, str) or not isinstance(text, str):
            raise InputError(f"{path}:{lineno}: a passage needs \"id\", \"title\" (string) and \"text\" (string)")
        yield str(pid), title, text


def _group_passages(rows: Iterable[tuple[str, str, str]]) -> Iterator[SourceDoc]:
    doc = None
    for pid, title, text in rows:
        if doc is None or title != doc.title:
            if doc is not None:
                yield doc
            doc = SourceDoc(id=pid, title=title, abstract=None, toc=[], units=[], meta={})
        doc.units.append(Unit(section=[], text=text, id_hint=pid))
    if doc is not None:
        yield doc


def _walk_sections(sections, path: list[str], where: str, toc: list[str], units: list[Unit]) -> None:
    if not isinstance(sections, list):
        raise InputError(f"{where}: \"sections\" must be a list")
    for sec in sections:
        if not isinstance(sec, dict) or not isinstance(sec.get("title", ""), str):
            raise InputError(f"{where}: each section must be an object with a string \"title\"")
        paragraphs = sec.get("paragraphs", [])
        if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
            raise InputError(f"{where}: section {sec.get('title')!r}: \"paragraphs\" must be a list of strings")
        title = sec.get("title", "").strip()
        sec_path = path + [title] if title else path
        if title:
            toc.append(title)
        text = "\n".join(p.strip() for p in paragraphs if p.strip())
        if text:
            units.append(Unit(section=sec_path, text=text))
        _walk_sections(sec.get("sections", []), sec_path, where, toc, units)


def _read_documents_jsonl(path: Path) -> Iterator[SourceDoc]:
    for lineno, obj in read_jsonl(path):
        where = f"{path}:{lineno}"
        if obj.get("id") is None or not isinstance(obj.get("title"), str) or "sections" not in obj:
            raise InputError(f"{where}: a document needs \"id\", \"title\" (string) and \"sections\"")
        abstract = obj.get("abstract")
        if abstract is not None and not isinstance(abstract, str):
            raise InputError(f"{where}: \"abstract\" must be a string")
        toc, units = [], []
        _walk_sections(obj["sections"], [], where, toc, units)
        meta = {k: v for k, v in obj.items() if k not in ("id", "title", "abstract", "sections")}
        yield SourceDoc(id=str(obj["id"]), title=obj["title"], abstract=abstract, toc=toc, units=units, meta=meta)


def _read_table(spec) -> Iterator[tuple[str, str, str]]:
    for i, row in rows(spec, default_split="train"):
        yield passage_fields(row, f"{spec}:{i}")


def read_source(path: str | os.PathLike, fmt: str = "auto") -> Iterator[SourceDoc]:
    if is_hub(path):
        if fmt not in ("auto", "table"):
            raise InputError(f"{path}: a hub dataset's rows are passages: --format table (or auto), not {fmt}")
        return _group_passages(_read_table(path))
    path = require_file(path, "corpus input")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "table":
        return _group_passages(_read_table(path))
    if fmt == "dpr-tsv":
        return _group_passages(_read_dpr_tsv(path))
    if fmt == "passages":
        return _group_passages(_read_passages_jsonl(path))
    if fmt == "documents":
        return _read_documents_jsonl(path)
    raise InputError(f"unknown corpus format {fmt!r}: one of auto, {', '.join(FORMATS)}")


# --- build -------------------------------------------------------------------------------------

def doc_passages(doc: SourceDoc, max_words: int = MAX_WORDS) -> list[dict]:
    out = []
    for unit in doc.units:
        spans = split_passages(unit.text, max_words)
        for k, (start, end) in enumerate(spans):
            if unit.id_hint is not None:
                pid = unit.id_hint if len(spans) == 1 else f"{unit.id_hint}-{k}"
            else:
                pid = f"{doc.id}#{len(out)}"
            out.append({"id": pid, "doc_id": doc.id, "title": doc.title, "section": unit.section,
                        "text": unit.text[start:end], "char_start": start, "char_end": end})
    return out


class _Distinct:
    """Ids seen, 8 bytes each (DPR's 21M passage ids as Python strings would take some 2 GB): `repeated()`
    names one given twice, found again among `ids()` only when the hashes say there is one."""

    def __init__(self):
        self.hashes = array("q")

    def add(self, id_: str) -> None:
        self.hashes.append(_id_hash(id_))

    def repeated(self, ids: Callable[[], Iterable[str]]) -> str | None:
        hashes = np.frombuffer(self.hashes, dtype=np.int64)
        values, counts = np.unique(hashes, return_counts=True)
        twice = set(values[counts > 1].tolist())
        if not twice:
            return None
        seen = set()
        for id_ in ids():
            if _id_hash(id_) in twice:
                if id_ in seen:
                    return id_
                seen.add(id_)
        return None   # two ids of one 64-bit hash: not a repeat


def _id_hash(id_: str) -> int:
    return int.from_bytes(hashlib.blake2b(id_.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little",
                          signed=True)


def _ids_in(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["id"]


def build_corpus(inputs: list[str | os.PathLike], out_dir: str | os.PathLike, fmt: str = "auto",
                 max_words: int = MAX_WORDS) -> dict:
    """Stream the inputs into passages.jsonl and documents.jsonl in out_dir. One document is held in
    memory at a time; outputs appear only when complete. Passage and document ids must be distinct
    (both are looked up by id); corpus.json records the files' sizes and sha256, which every opening
    checks."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # each file's sha256 and size as it is written (corpus.json records them; DPR's passages are 13 GB to
    # read back); the passages' sha256 is the corpus's fingerprint too
    written = {name: [hashlib.sha256(), 0] for name in ("passages.jsonl", "documents.jsonl")}
    fingerprint = written["passages.jsonl"][0]
    n_passages = n_docs = 0
    passage_ids, doc_ids = _Distinct(), _Distinct()

    def write(f, name: str, line: bytes) -> None:
        written[name][0].update(line)
        written[name][1] += len(line)
        f.write(line)
    with atomic_path(out_dir / "passages.jsonl") as p_tmp, atomic_path(out_dir / "documents.jsonl") as d_tmp, \
            open(p_tmp, "wb") as p_out, open(d_tmp, "wb") as d_out:
        for path in inputs:
            for doc in tqdm(read_source(path, fmt), desc=f"corpus {path if is_hub(path) else Path(path).name}", unit=" docs",
                            mininterval=2, disable=None):
                passages = doc_passages(doc, max_words)
                doc_ids.add(doc.id)
                for p in passages:
                    passage_ids.add(p["id"])
                    write(p_out, "passages.jsonl", (json.dumps(p, ensure_ascii=False) + "\n").encode("utf-8"))
                abstract = doc.abstract if doc.abstract is not None else (passages[0]["text"] if passages else "")
                write(d_out, "documents.jsonl", (json.dumps(
                    {"id": doc.id, "title": doc.title, "abstract": abstract, "toc": doc.toc, "n_passages": len(passages),
                     **doc.meta}, ensure_ascii=False) + "\n").encode("utf-8"))
                n_passages += len(passages)
                n_docs += 1
        if not n_passages:
            # An empty corpus would index nothing and answer nothing, silently: refuse it before it replaces one.
            raise InputError(f"{', '.join(map(str, inputs))}: no passage text in {n_docs} documents")
        p_out.flush(), d_out.flush()
        for what, ids, tmp in (("passage", passage_ids, p_tmp), ("document", doc_ids, d_tmp)):
            twice = ids.repeated(lambda: _ids_in(tmp))
            if twice is not None:
                raise InputError(f"{', '.join(map(str, inputs))}: the {what} id {twice!r} is given more than once; "
                                 f"{what}s are looked up by id, so each needs its own")
    info = {"passages": n_passages, "documents": n_docs, "max_words": max_words,
            "inputs": [str(p) if is_hub(p) else str(Path(p).resolve()) for p in inputs],
            "fingerprint": fingerprint.hexdigest()[:16],
            "files": {name: {"bytes": size, "sha256": h.hexdigest()} for name, (h, size) in written.items()}}
    write_json(out_dir / "corpus.json", info)
    log.info("wrote %d passages of %d documents to %s", n_passages, n_docs, out_dir)
    return info


# --- reading a built corpus -----------------------------------------------------------------------

def corpus_info(corpus_dir: str | os.PathLike) -> dict:
    corpus_dir = Path(corpus_dir)
    path = corpus_dir / "corpus.json"
    if not path.exists():
        raise InputError(f"{corpus_dir} is not a built corpus (no corpus.json): run `odqa corpus build` first")
    return read_json(path)


def _cache(path: Path, write) -> None:
    """Keep a look-up table beside the corpus for the next opening; a corpus directory this process
    cannot write to (a shared, read-only copy) is read without one."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            write(f)
    except OSError as e:
        log.warning("%s not cached (%s): the next opening reads the file again", path, e)


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _line_index(path: Path, cache: Path, build) -> dict[str, np.ndarray]:
    """Look-up arrays of a corpus file (`build()`'s), cached beside it with the file's size and mtime. A
    file changed after the cache was written (a passage edited by hand) is walked again rather than
    read at stale byte offsets."""
    if cache.exists():
        arrays = _cached(cache, path)
        if arrays is not None:
            return arrays
    arrays = build()
    _cache(cache, lambda f: np.savez(f, stat=np.asarray(_stat(path), np.int64), **arrays))
    return arrays


def _cached(cache: Path, path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of a line index cached for `path`'s current size and mtime, or None: also when the cache is
    damaged (zip's CRC catches a flipped byte, a truncation ends the archive early) or holds offsets that
    cannot be `path`'s lines (each array one entry a line, offsets rising from 0 within the file); a cache is
    derived, so it is walked again rather than refused."""
    try:
        with np.load(cache, allow_pickle=False) as z:
            if z["stat"].tolist() != _stat(path):
                return None
            arrays = {name: z[name] for name in z.files if name != "stat"}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        log.warning("%s is damaged (%s: %s): reading %s again", cache, type(e).__name__, e, path)
        return None
    offsets = arrays.get("offsets")
    if offsets is None or offsets.ndim != 1 or offsets.dtype.kind != "i" or \
            any(a.ndim != 1 or len(a) != len(offsets) for a in arrays.values()) or \
            (len(offsets) and (offsets[0] != 0 or offsets[-1] >= path.stat().st_size or np.any(np.diff(offsets) <= 0))):
        log.warning("%s holds offsets that are not %s's lines: reading it again", cache, path)
        return None
    return arrays


class JsonLines(Sequence):
    """A JSONL file's objects by row, each read from its byte offset when asked for. Reads are positional
    (pread), so processes forked with it open (DataLoader workers) do not move each other's place."""

    def __init__(self, path: Path, offsets: np.ndarray):
        self.path, self.offsets, self.size = path, offsets, path.stat().st_size
        self._fd = None

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, row):
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        row = range(len(self))[row]
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        start = int(self.offsets[row])
        end = int(self.offsets[row + 1]) if row + 1 < len(self) else self.size
        return parse_json(os.pread(self._fd, end - start, start).decode("utf-8", errors="replace"),
                          f"{self.path}, row {row}")

    def close(self, _close=os.close) -> None:   # bound now: at interpreter exit `os` may be gone before __del__
        if getattr(self, "_fd", None) is not None:
            _close(self._fd)
            self._fd = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_fd": None}   # a process it is sent to (spawned workers) opens its own

    def __del__(self):
        self.close()

    def __iter__(self) -> Iterator[dict]:
        for _, obj in read_jsonl(self.path):
            yield obj


def _check_file(corpus_dir: Path, info: dict, name: str) -> None:
    """A corpus file as corpus.json recorded it (its size; its sha256 up to VERIFY_ON_OPEN_BYTES): a passage
    edited after indexing would be read at the index's character offsets, an answer cut mid-word. A corpus
    built before corpus.json recorded its files is read as it is."""
    if "files" in info:
        recorded = {"files": {k: v for k, v in info["files"].items() if k == name}}
        check_checksums(corpus_dir, recorded, "corpus", state="changed", record="corpus.json",
                        advice="a corpus is rebuilt (`odqa corpus build`) rather than edited, with the indexes built "
                               "from it", reads=[name])


class PassageStore:
    """Passages of a built corpus by row number, read lazily: only the byte offset of each line is
    held (8 bytes a passage), so 21M passages cost ~170 MB rather than their text."""

    def __init__(self, corpus_dir: str | os.PathLike):
        self.dir = Path(corpus_dir)
        self.info = corpus_info(self.dir)
        self.path = require_file(self.dir / "passages.jsonl", "passages file")
        _check_file(self.dir, self.info, "passages.jsonl")
        self.offsets = self._offsets()
        if len(self.offsets) != self.info["passages"]:
            raise InputError(f"{self.path} has {len(self.offsets)} lines but corpus.json says {self.info['passages']}")
        self._lines = JsonLines(self.path, self.offsets)

    def _offsets(self) -> np.ndarray:
        def walk() -> dict[str, np.ndarray]:
            offsets, pos = array("q"), 0   # 8 bytes a passage as it grows; a list of ints takes 36
            with open(self.path, "rb") as f:
                for line in f:
                    if line.strip():       # blank lines are skipped, as read_jsonl and DocumentTable skip them
                        offsets.append(pos)
                    pos += len(line)
            return {"offsets": np.frombuffer(offsets, dtype=np.int64).copy()}
        return _line_index(self.path, self.dir / f"passages.offsets.{self.info['fingerprint']}.npz", walk)["offsets"]

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, row: int) -> dict:
        return self._lines[row]

    def __iter__(self) -> Iterator[dict]:
        return iter(self._lines)

    def rows_of(self, ids: Iterable) -> dict[str, int]:
        """The rows of the passages with these ids, in one pass over the file; an id the corpus lacks
        is left out. Only the ids asked for are held: every passage's would be gigabytes at 21M."""
        wanted = set(ids)
        return {p["id"]: row for row, p in enumerate(self) if p["id"] in wanted}

    def close(self) -> None:
        self._lines.close()


class DocumentTable:
    """documents.jsonl by row, with each document's passage rows: a document's passages are consecutive
    in passages.jsonl, so document d holds rows first[d] .. first[d] + count[d] - 1. Only each document's
    byte offset, id and passage count are held (`docs[d]` reads the rest), cached beside the file: DPR's
    3.2M documents held whole would cost about 5 GB (1.6 KB a document here)."""

    def __init__(self, corpus_dir: str | os.PathLike):
        self.dir = Path(corpus_dir)
        info = corpus_info(self.dir)
        path = require_file(self.dir / "documents.jsonl", "documents file")
        _check_file(self.dir, info, "documents.jsonl")
        offsets, self.count, self.ids = self._index(path, info["fingerprint"])
        self.docs = JsonLines(path, offsets)
        if int(self.count.sum()) != info["passages"]:
            raise InputError(f"{path}: its documents hold {int(self.count.sum())} passages but corpus.json "
                             f"says {info['passages']}")
        self.first = np.concatenate([[0], np.cumsum(self.count)[:-1]]).astype(np.int64)
        self.doc_of_passage = np.repeat(np.arange(len(self.ids), dtype=np.int64), self.count)

    def _index(self, path: Path, fingerprint: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        z = _line_index(path, self.dir / f"documents.index.{fingerprint}.npz", lambda: self._walk(path))
        return z["offsets"], z["count"], z["ids"]

    @staticmethod
    def _walk(path: Path) -> dict[str, np.ndarray]:
        offsets, count, ids, pos = [], [], [], 0
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    doc = parse_json(line.decode("utf-8", errors="replace"), f"{path}:{lineno}")
                    if not isinstance(doc, dict) or "id" not in doc or not isinstance(doc.get("n_passages"), int):
                        raise InputError(f"{path}:{lineno}: a document needs an id and n_passages")
                    offsets.append(pos)
                    count.append(doc["n_passages"])
                    ids.append(str(doc["id"]))
                pos += len(line)
        return {"offsets": np.asarray(offsets, np.int64), "count": np.asarray(count, np.int64),
                "ids": np.asarray(ids, dtype=str)}

    @cached_property
    def row_of(self) -> dict[str, int]:
        return {doc_id: i for i, doc_id in enumerate(self.ids.tolist())}

    def __len__(self) -> int:
        return len(self.ids)

    def passage_rows(self, doc_row: int) -> range:
        return range(int(self.first[doc_row]), int(self.first[doc_row] + self.count[doc_row]))
