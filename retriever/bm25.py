"""BM25 over title + text of a built corpus, with bm25s: Lucene's scoring (k1=1.5, b=0.75),
English stop words removed, Snowball English stemming (PyStemmer).

The index lives in CORPUS/bm25/ with a manifest holding the corpus fingerprint and the parameters,
and is rebuilt when either changes.
"""
from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from bm25s.tokenization import Tokenized
from tqdm import tqdm

from odqa.common.artifact import build_dir, current_manifest, read_manifest
from odqa.common.corpus import PassageStore, corpus_info
from odqa.common.io import InputError, loading
from odqa.common.ranks import current
from odqa.retriever.args import BM25Params

log = logging.getLogger(__name__)
logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets DEBUG on its logger when imported


class TermIds(Sequence):
    """Each passage's term ids, as bm25s's `index` reads them (a list of ints a passage), held as one
    int32 array and the passages' bounds in it. A list of lists of Python ints, or of token strings as
    bm25s tokenizes by default, takes 9 to 15 times the memory: tens of GB at DPR's 21M passages."""

    def __init__(self, ids: np.ndarray, bounds: np.ndarray):
        self.ids, self.bounds = ids, bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[self.bounds[i]:self.bounds[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        for a, b in zip(self.bounds[:-1].tolist(), self.bounds[1:].tolist()):
            yield self.ids[a:b].tolist()


class BM25Index:
    def __init__(self, model: bm25s.BM25, params: BM25Params, fingerprint: str):
        self.model = model
        self.params = params
        self.fingerprint = fingerprint
        self._stemmer = Stemmer.Stemmer(params.stemmer) if params.stemmer else None

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        return bm25s.tokenize(texts, stopwords=self.params.stopwords, stemmer=self._stemmer,
                              return_ids=False, show_progress=False)

    @classmethod
    def build(cls, corpus_dir: str | os.PathLike, params: BM25Params = BM25Params()) -> "BM25Index":
        corpus_dir = Path(corpus_dir)
        info = corpus_info(corpus_dir)
        store = PassageStore(corpus_dir)
        log.info("building a BM25 index over %d passages of %s", len(store), corpus_dir)
        index = cls.from_texts((f"{p['title']} {p['text']}" for p in store), params, info["fingerprint"],
                               total=len(store))
        store.close()
        with build_dir(corpus_dir / "bm25", cls.key(info["fingerprint"], params), passages=index.num_passages) as (tmp, _):
            index.model.save(str(tmp), show_progress=False)
        return index

    @staticmethod
    def key(corpus_fingerprint: str, params: BM25Params) -> dict:
        # the preset is only a name for its k1 and b: an index built with them is the same whichever way
        return {"corpus": corpus_fingerprint, "params": {k: v for k, v in asdict(params).items() if k != "bm25_preset"}}

    @classmethod
    def from_texts(cls, texts: Iterable[str], params: BM25Params = BM25Params(), fingerprint: str = "",
                   show_progress: bool = True, total: int | None = None, chunk: int = 10_000) -> "BM25Index":
        """An in-memory index over any texts (rows are positions in `texts`), read `chunk` at a time: the
        texts are tokenized as questions are, and only their term ids are kept (`TermIds`)."""
        index = cls(bm25s.BM25(k1=params.k1, b=params.b, method=params.method), params, fingerprint)
        vocab: dict[str, int] = {}
        ids, lengths = [], []
        texts = iter(texts)
        with tqdm(total=total, desc="BM25 tokenize", unit=" passages", disable=None if show_progress else True) as bar:
            while batch := list(itertools.islice(texts, chunk)):
                tokens = index.tokenize(batch)
                ids.append(np.array([vocab.setdefault(t, len(vocab)) for doc in tokens for t in doc], np.int32))
                lengths.append(np.array([len(doc) for doc in tokens], np.int64))
                bar.update(len(batch))
        if not vocab:
            raise InputError("BM25: the passages hold no words to index")
        bounds = np.concatenate([[0], np.cumsum(np.concatenate(lengths))])
        index.model.index(Tokenized(ids=TermIds(np.concatenate(ids), bounds), vocab=vocab), show_progress=show_progress)
        return index

    @classmethod
    def load(cls, corpus_dir: str | os.PathLike, mmap: bool = False) -> "BM25Index":
        """`mmap`: the score matrix stays on disk, paged in as read: for `scores_of`, which reads a few
        postings of a question's terms (DPR's 21M passages' matrix is some 11 GB)."""
        corpus_dir = Path(corpus_dir)
        index_dir = corpus_dir / "bm25"
        manifest = read_manifest(index_dir)
        if manifest is None or "key" not in manifest:
            raise InputError(f"{index_dir} is not a BM25 index (no manifest.json with a key): run `odqa retrieve` "
                             "to build one")
        fingerprint = corpus_info(corpus_dir)["fingerprint"]
        if manifest["key"]["corpus"] != fingerprint:
            raise InputError(f"{index_dir} was built for another version of the corpus "
                             f"({manifest['key']['corpus']} != {fingerprint}): rebuild it")
        with loading(index_dir, "the BM25 index"):
            model = bm25s.BM25.load(str(index_dir), mmap=mmap, show_progress=False)
        return cls(model, BM25Params(**manifest["key"]["params"]), fingerprint)

    @classmethod
    def open(cls, corpus_dir: str | os.PathLike, params: BM25Params = BM25Params(), mmap: bool = False) -> "BM25Index":
        """The saved index if it matches the corpus and the parameters (`load`), else a freshly built one
        (under a launcher, built by rank 0 while the others wait, then loaded by them)."""
        key, ranks = cls.key(corpus_info(corpus_dir)["fingerprint"], params), current()
        saved = current_manifest(Path(corpus_dir) / "bm25", key)
        ranks.barrier()   # every rank has looked before rank 0 writes: all take the same branch
        if saved:
            return cls.load(corpus_dir, mmap)
        built = cls.build(corpus_dir, params) if ranks.main else None
        ranks.barrier()
        return built or cls.load(corpus_dir, mmap)

    @property
    def num_passages(self) -> int:
        return int(self.model.scores["num_docs"])

    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows (into passages.jsonl) and scores of the top k passages, each (len(questions), k)."""
        k = min(k, self.num_passages)
        rows, scores = self.model.retrieve(self.tokenize(questions), k=k, show_progress=False, n_threads=0)
        return rows, scores

    def scores(self, question: str) -> np.ndarray:
        """The BM25 score of every passage for one question (zeros for a question of stop words only)."""
        tokens = self.tokenize([question])[0]
        if not tokens:   # bm25s's get_scores indexes the first token
            return np.zeros(self.num_passages, np.dtype(self.model.dtype))
        return self.model.get_scores(tokens)

    def scores_of(self, question: str, rows) -> np.ndarray:
        """`scores(question)[rows]`, equal to the bit, without scoring every passage: each query term's
        postings (the index's CSC column, passage rows ascending: bm25s's default CSC builder sorts by
        column, then row) are searched for the rows. A rerank needs a few hundred rows' scores; over
        21M passages a whole score vector is 84 MB a question."""
        rows = np.asarray(rows, dtype=np.int64)
        index = self.model.scores
        data, indices, indptr = index["data"], index["indices"], index["indptr"]
        out = np.zeros(len(rows), np.dtype(self.model.dtype))
        terms = self.model.get_tokens_ids(self.tokenize([question])[0])
        # term by term, in the question's order, as bm25s adds them (float32 sums in another order differ)
        for term in terms:
            postings = indices[indptr[term]:indptr[term + 1]]
            if len(postings):
                at = np.minimum(np.searchsorted(postings, rows), len(postings) - 1)
                hit = postings[at] == rows
                out[hit] += data[indptr[term] + at[hit]]
        if self.model.nonoccurrence_array is not None:   # BM25L and BM25+ score absent terms too
            out += self.model.nonoccurrence_array[np.asarray(terms, dtype=np.int64)].sum()
        return out
