"""DHR's document retriever: a dual encoder over document summaries.

A document is read as its summary: `[CLS] title, toc_1, toc_2, ... [SEP] abstract [SEP]`, the table of
contents linearised by a pre-order walk of the section titles, comma-separated (DHR Table 4: commas
beat [SEP] between titles), the document title at the root of that tree. Questions and documents go
through two LMs started from the same checkpoint (default the data pack's MiniLM); vectors are mean-
pooled and L2-normalised, which is how that checkpoint was trained, so an untrained pair already
retrieves; scores are cosines, scaled by `scale` inside the training softmax.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from odqa.common.io import InputError, hash_files
from odqa.common.timings import stage
from odqa.retriever.args import DocEncoderConfig
from odqa.retriever.lm import load_lm, open_checkpoint, saving_checkpoint
from odqa.retriever.pooling import mean_pool


def doc_summary(doc: dict) -> tuple[str, str]:
    """(title tree, abstract) of a documents.jsonl row."""
    return ", ".join([doc["title"], *doc.get("toc", [])]), doc.get("abstract") or ""


CONFIG_FILE = "doc_encoder_config.json"


class DocEncoder(nn.Module):
    def __init__(self, config: DocEncoderConfig, lms: dict[str, nn.Module] | None = None,
                 questions_only: bool = False):
        """`questions_only`: without the document LM, which a search never runs (the index holds its
        vectors); such an encoder encodes questions and is not saved."""
        super().__init__()
        self.config = config
        lms = lms or {}
        self.question_lm = lms.get("question_lm") or load_lm(config.encoder)
        self.doc_lm = None if questions_only else lms.get("doc_lm") or load_lm(config.encoder)

    def encode_questions(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        h = self.question_lm(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state
        return mean_pool(h, attention_mask)

    def encode_docs(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        h = self.doc_lm(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state
        return mean_pool(h, attention_mask)

    def forward(self, questions: dict, docs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Training's encodings, through forward so that DDP/DeepSpeed synchronise their gradients."""
        return self.encode_questions(**questions), self.encode_docs(**docs)

    def save_pretrained(self, out_dir: str | os.PathLike, tokenizer=None) -> None:
        if self.doc_lm is None:
            raise ValueError("a document encoder loaded for questions only would be saved without its document LM")
        with saving_checkpoint(out_dir, {"question_lm": self.question_lm, "doc_lm": self.doc_lm}, self.config,
                               CONFIG_FILE, tokenizer):
            pass   # nothing of its own beside the two LMs

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, questions_only: bool = False) -> "DocEncoder":
        names = ("question_lm",) if questions_only else ("question_lm", "doc_lm")
        return cls(*open_checkpoint(path, CONFIG_FILE, DocEncoderConfig, names, "document encoder"), questions_only)


def is_doc_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).exists()


def doc_encoder_hash(path: str | os.PathLike) -> str:
    """Identifies the document side of a checkpoint, which a document index is built with."""
    return hash_files(path, sorted((Path(path) / "doc_lm").rglob("*")))


def tokenize_docs(tokenizer, docs: list[dict], max_tokens: int) -> dict:
    trees, abstracts = zip(*(doc_summary(d) for d in docs))
    return dict(tokenizer(list(trees), list(abstracts), truncation="longest_first", max_length=max_tokens,
                          padding=True, return_tensors="pt"))


def tokenize_questions(tokenizer, questions: list[str], max_tokens: int) -> dict:
    return dict(tokenizer(questions, truncation=True, max_length=max_tokens, padding=True, return_tensors="pt"))


def doc_batch_order(docs: list[dict]) -> np.ndarray:
    """The documents by summary length: batches of like lengths pad less."""
    return np.argsort([len(doc_summary(d)[1]) + len(doc_summary(d)[0]) for d in docs], kind="stable")


@torch.no_grad()
def encode_all_docs(model: DocEncoder, tokenizer, docs: list[dict], batch_size: int = 64,
                    device: str = "cpu", desc: str | None = "encode documents") -> np.ndarray:
    """Vectors of every document, in input order (batched by summary length)."""
    was_training = model.training
    model.eval()
    order = doc_batch_order(docs)
    out = np.zeros((len(docs), model.doc_lm.config.hidden_size), dtype=np.float32)
    for a in tqdm(range(0, len(order), batch_size), desc=desc, disable=None if desc else True):
        idx = order[a:a + batch_size]
        enc = tokenize_docs(tokenizer, [docs[i] for i in idx], model.config.max_doc_tokens)
        out[idx] = model.encode_docs(**{k: v.to(device) for k, v in enc.items()}).float().cpu().numpy()
    model.train(was_training)
    return out


@stage("question encoders")
@torch.no_grad()
def encode_questions(model: DocEncoder, tokenizer, questions: list[str], batch_size: int = 64,
                     device: str = "cpu") -> np.ndarray:
    for q in questions:
        if not isinstance(q, str) or not q.strip():
            raise InputError(f"empty question: {q!r}")
    was_training = model.training
    model.eval()
    out = []
    order = np.argsort([len(q) for q in questions], kind="stable")   # batches of like lengths pad less
    for a in range(0, len(questions), batch_size):
        enc = tokenize_questions(tokenizer, [questions[i] for i in order[a:a + batch_size]],
                                 model.config.max_question_tokens)
        out.append(model.encode_questions(**{k: v.to(device) for k, v in enc.items()}).float().cpu().numpy())
    model.train(was_training)
    if not out:
        return np.zeros((0, model.question_lm.config.hidden_size), np.float32)
    return np.concatenate(out)[np.argsort(order)]
