"""A single-vector dense passage retriever: the comparator of DensePhrases' Table 1, searched by exact
inner product (faiss Flat). Two kinds of encoder:

- one encoder for both sides (`MeanPoolEncoder`, default the data pack's MiniLM): passages ("title
  text", one string) and questions are its mean-pooled, L2-normalised token states, as its
  sentence-transformers pipeline gives them (Transformer, mean pooling, Normalize), so inner product is
  cosine;
- DPR's two (`DPREncoder`): a question encoder and a context encoder, published as transformers'
  `DPRQuestionEncoder` and `DPRContextEncoder` (facebook/dpr-*-single-nq-base); a vector is the [CLS]
  state (through the encoder's projection where it has one), not normalised, and a passage is encoded
  as the pair (title, text), as DPR's `generate_dense_embeddings` encodes it.

The index lives in CORPUS/dense-<passage encoder's name>/ with the corpus fingerprint and the encoder's name.
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
from odqa.common.ranks import current, parts_beside, split_arrays
from odqa.common.weights import from_pretrained_whole
from odqa.retriever.lm import load_lm, load_tokenizer
from odqa.retriever.pooling import mean_pool

log = logging.getLogger(__name__)


class MeanPoolEncoder:
    """One encoder for questions and passages: mean-pooled, normalised token states."""
    def __init__(self, name_or_path: str, max_tokens: int = 256, device: str | None = None, dtype=None):
        """`dtype`: the encoder's (default `search_dtype`: bfloat16 where the hardware computes it)."""
        self.device = pick_device(device)
        self.tokenizer = load_tokenizer(name_or_path)
        self.model = load_lm(name_or_path).to(self.device, dtype or search_dtype(self.device)).eval()
        self.max_tokens = max_tokens

    @property
    def dim(self) -> int:
        return self.model.config.hidden_size

    @torch.no_grad()
    def encode(self, texts: list[str], batch_size: int = 64, desc: str | None = None) -> np.ndarray:
        out = []
        order = np.argsort([len(t) for t in texts])  # similar lengths batch together
        for a in tqdm(range(0, len(order), batch_size), desc=desc, disable=desc is None or None):
            out.append(self.encode_batch([texts[i] for i in order[a:a + batch_size]]))
        vecs = np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
        result = np.empty_like(vecs)
        result[order] = vecs
        return result

    @torch.no_grad()
    def encode_batch(self, texts: list[str]) -> np.ndarray:
        enc = self.tokenizer(texts, truncation=True, max_length=self.max_tokens, padding=True, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        h = self.model(**enc).last_hidden_state
        return mean_pool(h, enc["attention_mask"]).float().cpu().numpy()

    def encode_passages(self, passages: list[dict]) -> np.ndarray:
        return self.encode_batch([f"{p['title']} {p['text']}" for p in passages])


class DPREncoder(MeanPoolEncoder):
    """One side of DPR: `side` "question" or "passage". A checkpoint of transformers' DPR classes
    (model_type "dpr") loads as its side's class, whole (a context encoder given as the question encoder
    is refused, not initialised at random); any other BERT-family checkpoint is taken as it is, its
    vector the last layer's [CLS] state, as DPR's own `BertEncoder` takes it."""
    def __init__(self, name_or_path: str, side: str, max_tokens: int = 256, device: str | None = None, dtype=None):
        from transformers import AutoConfig, DPRContextEncoder, DPRQuestionEncoder
        self.device = pick_device(device)
        self.tokenizer = load_tokenizer(name_or_path)
        with loading(name_or_path, "a DPR encoder's config"):
            self.dpr = AutoConfig.from_pretrained(name_or_path).model_type == "dpr"
        if self.dpr:
            cls = DPRQuestionEncoder if side == "question" else DPRContextEncoder
            model = from_pretrained_whole(cls, name_or_path, f"DPR's {side} encoder's weights")
        else:
            model = load_lm(name_or_path)
        self.model = model.to(self.device, dtype or search_dtype(self.device)).eval()
        self.max_tokens = max_tokens

    @property
    def dim(self) -> int:
        config = self.model.config
        return (config.projection_dim or config.hidden_size) if self.dpr else config.hidden_size

    @torch.no_grad()
    def encode_batch(self, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        enc = self.tokenizer(texts, pairs, truncation=True, max_length=self.max_tokens, padding=True,
                             return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        out = self.model(**enc)
        vectors = out.pooler_output if self.dpr else out.last_hidden_state[:, 0]
        return vectors.float().cpu().numpy()

    @torch.no_grad()
    def encode_passages(self, passages: list[dict]) -> np.ndarray:
        return self.encode_batch([p["title"] for p in passages], [p["text"] for p in passages])


class DenseIndex:
    def __init__(self, encoder: MeanPoolEncoder, index: faiss.Index):
        self.encoder, self.index = encoder, index   # the question encoder

    @staticmethod
    def index_dir(corpus_dir: str | os.PathLike, encoder: str) -> Path:
        return Path(corpus_dir) / f"dense-{Path(str(encoder).rstrip('/')).name}"

    @classmethod
    def open(cls, corpus_dir: str | os.PathLike, encoder: str, passage_encoder: str | None = None,
             batch_size: int = 64, add_chunk: int = 65_536) -> "DenseIndex":
        """The saved index for this corpus and encoder, or one built now: under a launcher each rank
        encodes its share of the passages, and a build cut short resumes from its finished batches
        (common/ranks.py). No passage is held beyond its batch: the vectors go through a memory-mapped
        file, in corpus order, into the index, the one copy in memory. With `passage_encoder`, DPR's
        pair: `encoder` encodes the questions and `passage_encoder` the passages (`DPREncoder`)."""
        side = passage_encoder or encoder
        out = cls.index_dir(corpus_dir, side)
        key = {"corpus": corpus_info(corpus_dir)["fingerprint"], "encoder": str(side),
               **({"pooling": "cls"} if passage_encoder else {})}
        enc = DPREncoder(str(encoder), "question") if passage_encoder else MeanPoolEncoder(str(encoder))
        if not current_manifest(out, key):
            passages = DPREncoder(str(passage_encoder), "passage") if passage_encoder else enc
            cls._build(passages, corpus_dir, out, key, batch_size, add_chunk)
        with loading(out / "passages.faiss", "the dense index"):
            index = faiss.read_index(str(out / "passages.faiss"))
        if index.d != enc.dim:
            raise InputError(f"{out}: passage vectors of {index.d} dimensions, but the question encoder {encoder} "
                             f"gives {enc.dim}: not the pair it was built with")
        return cls(enc, index)

    @staticmethod
    def _build(enc: MeanPoolEncoder, corpus_dir, out: Path, key: dict, batch_size: int, add_chunk: int) -> None:
        ranks = current()
        store = PassageStore(corpus_dir)
        # the batches `encode` makes of the whole corpus: similar lengths together, in the same order
        order = np.argsort(np.array([len(p["title"]) + 1 + len(p["text"]) for p in store]))

        def encode(rows) -> np.ndarray:
            return enc.encode_passages([store[int(r)] for r in rows])
        dim = enc.dim
        vectors_path = out.with_name(f".{out.name}.vectors.npy")
        vectors = np.lib.format.open_memmap(vectors_path, mode="w+", dtype=np.float32, shape=(len(order), dim)) \
            if ranks.main else None
        at = 0
        for part in split_arrays(encode, order, batch_size, parts_beside(out), key,
                                 desc="dense passages"):
            vectors[order[at:at + len(part)]] = part
            at += len(part)
        store.close()
        if ranks.main:
            index = faiss.IndexFlatIP(dim)
            for a in range(0, len(order), add_chunk):
                index.add(np.ascontiguousarray(vectors[a:a + add_chunk]))
            del vectors
            with build_dir(out, key, passages=len(order), dim=int(dim)) as (tmp, _):
                faiss.write_index(index, str(tmp / "passages.faiss"))
            vectors_path.unlink()
        ranks.barrier()   # the index is written before any rank opens it

    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        for q in questions:
            if not q.strip():
                raise InputError("empty question")
        scores, rows = self.index.search(self.encoder.encode(questions), min(k, self.index.ntotal))
        return rows, scores
