"""A single-vector dense passage retriever: the comparator of DensePhrases' Table 1 (DPR-style).

Passages ("title text", one string) and questions are mean-pooled, L2-normalised token states of one
encoder (default the data pack's MiniLM, used as its sentence-transformers pipeline does: Transformer,
mean pooling, Normalize), searched by exact inner product (faiss Flat), i.e. cosine.
The index lives in CORPUS/dense-<name>/ with the corpus fingerprint and the encoder's name.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import faiss
import numpy as np
import torch
from tqdm import tqdm

from odqa.common.artifact import build_dir, current_manifest
from odqa.common.corpus import PassageStore, corpus_info
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError, loading
from odqa.retriever.lm import load_lm, load_tokenizer
from odqa.retriever.pooling import mean_pool

log = logging.getLogger(__name__)


class MeanPoolEncoder:
    def __init__(self, name_or_path: str, max_tokens: int = 256, device: str | None = None, dtype=None):
        """`dtype`: the encoder's (default `search_dtype`: bfloat16 where the hardware computes it)."""
        self.device = pick_device(device)
        self.tokenizer = load_tokenizer(name_or_path)
        self.model = load_lm(name_or_path).to(self.device, dtype or search_dtype(self.device)).eval()
        self.max_tokens = max_tokens

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, desc: str | None = None) -> np.ndarray:
        out = []
        order = np.argsort([len(t) for t in texts])  # similar lengths batch together
        for a in tqdm(range(0, len(order), batch_size), desc=desc, disable=desc is None or None):
            idx = order[a:a + batch_size]
            enc = self.tokenizer([texts[i] for i in idx], truncation=True, max_length=self.max_tokens,
                                 padding=True, return_tensors="pt")
            enc = {k: v.to(self.device) for k, v in enc.items()}
            h = self.model(**enc).last_hidden_state
            out.append(mean_pool(h, enc["attention_mask"]).float().cpu().numpy())
        vecs = np.concatenate(out) if out else np.zeros((0, self.model.config.hidden_size), np.float32)
        result = np.empty_like(vecs)
        result[order] = vecs
        return result


class DenseIndex:
    def __init__(self, encoder: MeanPoolEncoder, index: faiss.Index):
        self.encoder, self.index = encoder, index

    @staticmethod
    def index_dir(corpus_dir: str | os.PathLike, encoder: str) -> Path:
        return Path(corpus_dir) / f"dense-{Path(str(encoder).rstrip('/')).name}"

    @classmethod
    def open(cls, corpus_dir: str | os.PathLike, encoder: str) -> "DenseIndex":
        """The saved index for this corpus and encoder, or one built now."""
        out = cls.index_dir(corpus_dir, encoder)
        key = {"corpus": corpus_info(corpus_dir)["fingerprint"], "encoder": str(encoder)}
        enc = MeanPoolEncoder(str(encoder))
        if current_manifest(out, key):
            with loading(out / "passages.faiss", "the dense index"):
                return cls(enc, faiss.read_index(str(out / "passages.faiss")))
        store = PassageStore(corpus_dir)
        passages = list(store)
        store.close()
        vecs = enc.encode([f"{p['title']} {p['text']}" for p in passages], desc="dense passages")
        index = faiss.IndexFlatIP(vecs.shape[1])
        index.add(vecs)
        with build_dir(out, key, passages=len(passages), dim=int(vecs.shape[1])) as (tmp, _):
            faiss.write_index(index, str(tmp / "passages.faiss"))
        return cls(enc, index)

    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        for q in questions:
            if not q.strip():
                raise InputError("empty question")
        scores, rows = self.index.search(self.encoder.encode(questions), min(k, self.index.ntotal))
        return rows, scores
