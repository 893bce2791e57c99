"""`odqa build-doc-index` and `DocRetriever`: DHR's document level.

    docs.faiss      inner-product index over the document vectors (any `index_factory` string, as
                    for phrases: "Flat" here, "IVF4096,SQ8" and the like for millions of documents)
    manifest.json   document-encoder hash, factory, counts, corpus fingerprint
    lambda.json     the rerank weight chosen by `odqa tune-lambda`, when it has run

Row i of the index is row i of documents.jsonl. A retriever opens the index with a checkpoint
whose document side must be the one the index was built with (its question side pairs with it).
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import faiss
import numpy as np
import torch

from odqa.common.artifact import build_dir
from odqa.common.corpus import DocumentTable, corpus_info
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError, check_checksums, loading, read_json, read_object, write_json
from odqa.common.ranks import current, parts_beside, split_arrays
from odqa.common.timings import stage
from odqa.retriever.doc_encoder import (
    DocEncoder,
    doc_batch_order,
    doc_encoder_hash,
    encode_questions,
    tokenize_docs,
)
from odqa.retriever.lm import load_tokenizer

log = logging.getLogger(__name__)


def build_doc_index(model_dir: str | os.PathLike, corpus_dir: str | os.PathLike, out_dir: str | os.PathLike,
                    factory: str = "Flat", batch_size: int = 64, seed: int = 0) -> dict:
    """Under a launcher each rank encodes its share of the documents' batches (the batches
    `encode_all_docs` makes), and rank 0 builds and writes the index; a build cut short resumes from
    its finished batches (common/ranks.py)."""
    out_dir, ranks = Path(out_dir), current()
    device = pick_device()
    model = DocEncoder.from_pretrained(model_dir).to(device).eval()
    tokenizer = load_tokenizer(model_dir)
    table = DocumentTable(corpus_dir)
    encoder_hash, corpus = doc_encoder_hash(model_dir), corpus_info(corpus_dir)["fingerprint"]
    key = {"encoder_hash": encoder_hash, "corpus": corpus, "factory": factory}
    order = doc_batch_order(table.docs)
    kind = torch.device(device).type
    dtype = search_dtype(device) if kind == "cuda" else torch.float32   # the CPU's documents stay float32's

    @torch.no_grad()
    def encode(rows) -> np.ndarray:
        enc = tokenize_docs(tokenizer, [table.docs[i] for i in rows], model.config.max_doc_tokens)
        with torch.autocast(kind, dtype=dtype, enabled=dtype != torch.float32):
            return model.encode_docs(**{k: v.to(device) for k, v in enc.items()}).float().cpu().numpy()
    vecs = np.zeros((len(order), model.doc_lm.config.hidden_size), np.float32) if ranks.main else None
    at = 0
    for part in split_arrays(encode, order, batch_size, parts_beside(out_dir),
                             {**key, "batch_size": batch_size}, desc="encode documents"):
        vecs[order[at:at + len(part)]] = part
        at += len(part)
    if ranks.main:
        index = faiss.index_factory(vecs.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        if not index.is_trained:
            index.train(vecs[np.random.default_rng(seed).permutation(len(vecs))[:200_000]])
        index.add(vecs)
        with build_dir(out_dir, key, encoder_hash=encoder_hash, encoder=str(model_dir), factory=factory,
                       documents=len(table), dim=int(vecs.shape[1]), fingerprint=corpus) as (tmp, manifest):
            faiss.write_index(index, str(tmp / "docs.faiss"))
        log.info("document index %s: %d documents (%s)", out_dir, len(table), factory)
    ranks.barrier()   # the index is in place before any rank goes on
    return read_json(out_dir / "manifest.json")


class DocRetriever:
    """Top documents for questions: `search(questions, k) -> (doc rows, scores)`, each (n, k)."""

    def __init__(self, index_dir: str | os.PathLike, model_dir: str | os.PathLike, corpus_dir: str | os.PathLike,
                 nprobe: int = 64, device: str | None = None):
        self.dir = Path(index_dir)
        if not (self.dir / "manifest.json").exists():
            raise InputError(f"{self.dir} is not a document index (no manifest.json): run `odqa build-doc-index`")
        self.manifest = read_object(self.dir / "manifest.json", "a document index manifest")
        missing = [k for k in ("encoder_hash", "fingerprint", "documents") if k not in self.manifest]
        if missing:
            raise InputError(f"{self.dir / 'manifest.json'}: not a document index manifest (no {', '.join(missing)})")
        self.device = pick_device(device)
        # loaded (its files checked against its checksums) before its hash is compared: a damaged file is
        # named as such, not taken for another encoder
        self.model = DocEncoder.from_pretrained(model_dir, questions_only=True).to(
            self.device, search_dtype(self.device)).eval()
        if doc_encoder_hash(model_dir) != self.manifest["encoder_hash"]:
            raise InputError(f"{self.dir} was built with another document encoder than {model_dir}: its "
                             f"question encoder would not match the index; rebuild it with `odqa build-doc-index`")
        if corpus_info(corpus_dir)["fingerprint"] != self.manifest["fingerprint"]:
            raise InputError(f"{self.dir} was built from another version of the corpus {corpus_dir}")
        check_checksums(self.dir, self.manifest, "document index", reads=["docs.faiss"])
        with loading(self.dir / "docs.faiss", "the document index"):
            self.index = faiss.read_index(str(self.dir / "docs.faiss"))
        if self.index.ntotal != self.manifest["documents"]:
            raise InputError(f"{self.dir}: corrupt document index (docs.faiss disagrees with manifest.json)")
        ivf = faiss.try_extract_index_ivf(self.index)
        if ivf is not None:
            ivf.nprobe = nprobe
        self.tokenizer = load_tokenizer(model_dir)
        self.table = DocumentTable(corpus_dir)

    @property
    def tuned_lambda(self) -> float | None:
        return self._tuned("lambda", required=True)

    @property
    def tuned_bm25_weight(self) -> float | None:
        """The rerank's BM25 weight stored with lambda (files tuned before it was a term hold none)."""
        return self._tuned("bm25_weight", required=False)

    def _tuned(self, key: str, required: bool) -> float | None:
        """A weight `odqa tune-lambda` stored in lambda.json, refused by name unless a finite number."""
        path = self.dir / "lambda.json"
        if not path.exists():
            return None
        record = read_json(path)
        value = record.get(key) if isinstance(record, dict) else None
        if value is None and not required and isinstance(record, dict):
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InputError(f"{path}: {key!r} must be a finite number (a table written by `odqa tune-lambda`), "
                             f"not {value if isinstance(record, dict) else record!r}; run `odqa tune-lambda` again "
                             "or remove the file")
        return float(value)

    def save_lambda(self, result: dict) -> None:
        write_json(self.dir / "lambda.json", result)

    def search(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        vecs = encode_questions(self.model, self.tokenizer, questions, device=self.device)
        with stage("pre-filter"):
            scores, rows = self.index.search(vecs, min(k, self.index.ntotal))
        return rows, scores
