"""What a phrase search reads, opened and checked against each other before any question: the phrase
index and the model it was built with (by the phrase encoder's hash), the corpus it was built from (by
its fingerprint), and, where given, the document pre-filter over the same corpus, the passage reranker
and the answer memory built with this model's question encoders. A part that does not belong is named
with what to do, never searched with."""
from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
import torch

from odqa.common.corpus import DocumentTable, PassageStore, corpus_info
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError
from odqa.retriever.answer_memory import AnswerMemory
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_data import passage_title
from odqa.retriever.phrase_index import PhraseIndex
from odqa.retriever.phrase_model import DensePhraseModel, phrase_encoder_hash, question_encoder_hash


class SearchArtifacts:
    def __init__(self, index_dir: str | os.PathLike, model_dir: str | os.PathLike, corpus_dir: str | os.PathLike,
                 doc_index: str | os.PathLike | None = None, doc_model: str | os.PathLike | None = None, *,
                 reranker: str | os.PathLike | None = None, memory: str | os.PathLike | AnswerMemory | None = None,
                 nprobe: int = 64, device: str | None = None, dtype=None, trained: bool = False):
        """A part may be given opened (a `DocRetriever` as `doc_index`, an `AnswerMemory`), to share it.
        The phrase model is its question side alone, in `search_dtype` (bfloat16 where the hardware has
        it), unless it will be `trained` (query-side training saves it whole): then all of it, in float32
        (or `dtype`)."""
        from odqa.retriever.doc_index import DocRetriever
        self.prefilter = doc_index if isinstance(doc_index, DocRetriever) else None
        if doc_index and self.prefilter is None:
            if not doc_model:
                raise InputError("--doc-index needs --doc-model (the document encoder it was built with)")
            self.prefilter = DocRetriever(doc_index, doc_model, corpus_dir)
        self.reranker = None
        if reranker:
            from odqa.retriever.cross_encoder import CrossEncoder
            self.reranker = CrossEncoder.from_pretrained(reranker)
        self.memory = memory if isinstance(memory, AnswerMemory) else AnswerMemory(memory) if memory else None
        self.index = PhraseIndex(index_dir, nprobe)
        self.device = pick_device(device)
        # loaded (and its files checked against its checksums) before its hashes are compared: a damaged
        # file is named as such, not taken for another model
        dtype = dtype or (torch.float32 if trained else search_dtype(self.device))
        self.model = DensePhraseModel.from_pretrained(model_dir, questions_only=not trained).to(self.device, dtype).eval()
        if phrase_encoder_hash(model_dir) != self.index.manifest["encoder_hash"]:
            raise InputError(f"{index_dir} was built with another phrase encoder than {model_dir}: search with the "
                             f"model it was built from, or rebuild it from this one (`odqa dump-phrases`, then "
                             f"`odqa build-index`; a demo run does so in its index stage)")
        if corpus_info(corpus_dir)["fingerprint"] != self.index.manifest["fingerprint"]:
            raise InputError(f"{index_dir} was built from another version of the corpus {corpus_dir}")
        self.tokenizer = load_tokenizer(model_dir)
        if self.memory is not None and self.memory.question_encoder != question_encoder_hash(model_dir):
            raise InputError(f"{self.memory.dir} was built with other question encoders than {model_dir}'s, so "
                             f"their vectors would not compare: rebuild it with `odqa build-memory --model {model_dir}`")
        self.store = PassageStore(corpus_dir)
        # Popular passages come back for many questions: each is read (and parsed) once while it stays popular.
        self.passage = lru_cache(maxsize=65_536)(self.store.__getitem__)
        # Passage row r's vectors are ids passage_vec[r] .. passage_vec[r + 1] - 1.
        self.passage_vec = np.concatenate([[0], np.cumsum(self.index.meta["passage_count"])]).astype(np.int64)
        self.corpus_dir, self.model_dir, self._table, self._bm25 = corpus_dir, model_dir, None, None
        if self.reranker is not None:
            self.reranker.to(self.device).eval()
        if self.prefilter is not None:
            if self.prefilter.manifest["fingerprint"] != self.index.manifest["fingerprint"]:
                raise InputError(f"{self.prefilter.dir} and {index_dir} were built from different corpora")
            # Document d's vectors are ids doc_vec_start[d] .. doc_vec_end[d] - 1.
            table = self.prefilter.table
            self.doc_vec_start = self.passage_vec[table.first]
            self.doc_vec_end = self.passage_vec[table.first + table.count]

    @property
    def table(self) -> DocumentTable:
        """The corpus's documents and their passage rows (the pre-filter's, when there is one)."""
        if self._table is None:
            self._table = self.prefilter.table if self.prefilter is not None else DocumentTable(self.corpus_dir)
        return self._table

    def rows_of_doc(self, doc_id: str) -> range:
        d = self.table.row_of.get(doc_id)
        return range(0) if d is None else self.table.passage_rows(d)

    def bm25(self):
        """The corpus's BM25 index, opened on first use (memory-mapped: a rerank reads its candidates'
        scores only)."""
        if self._bm25 is None:
            from odqa.retriever.bm25 import BM25Index
            self._bm25 = BM25Index.open(self.corpus_dir, mmap=True)
        return self._bm25

    def source(self, in_title: bool, passage: dict) -> str:
        """The string a phrase's offsets index: its passage's text, or its title as the phrase model read it."""
        return passage_title(passage, self.model.config.title_path) if in_title else passage["text"]
