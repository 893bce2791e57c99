"""A cross-encoder passage reranker (monoBERT, Nogueira & Cho 2019): the question and a passage are read
together, `[CLS] question [SEP] title: text [SEP]`, and a linear head on [CLS] scores their relevance.
The phrase and document encoders read the question apart from the passage, so they can be indexed;
this one cannot, and reorders only the few passages the search returns (`Searcher(reranker=)`).

A checkpoint is a plain `AutoModelForSequenceClassification` with one label, its tokenizer, and
`cross_encoder.json` (max_tokens, and the `weight` of its score in the final ranking that
`odqa train-reranker` tuned on validation: z(search score) + weight x z(cross-encoder score)).
"""
from __future__ import annotations

import os
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from odqa.common.device import search_dtype
from odqa.common.io import InputError, atomic_path, write_json
from odqa.common.weights import UNUSED_EXTRA, UNUSED_MISSING, check_sealed, from_pretrained_whole, seal
from odqa.retriever.args import CrossEncoderConfig
from odqa.retriever.lm import load_tokenizer, read_config

CONFIG = "cross_encoder.json"


def passage_input(passage: dict) -> str:
    return f"{passage.get('title', '')}: {passage['text']}"


class CrossEncoder(nn.Module):
    def __init__(self, lm: nn.Module, tokenizer, config: CrossEncoderConfig):
        super().__init__()
        self.lm, self.tokenizer, self.config = lm, tokenizer, config

    @classmethod
    def from_encoder(cls, name_or_path: str | os.PathLike, max_tokens: int = 128) -> "CrossEncoder":
        """A new reranker: a BERT-family encoder with a fresh one-output head."""
        lm = from_pretrained_whole(AutoModelForSequenceClassification, name_or_path, "a language model's weights",
                                   may_lack=("classifier.", *UNUSED_MISSING), may_add=UNUSED_EXTRA, num_labels=1)
        return cls(lm, load_tokenizer(name_or_path), CrossEncoderConfig(encoder=str(name_or_path), max_tokens=max_tokens))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "CrossEncoder":
        path = Path(path)
        if not (path / CONFIG).exists():
            raise InputError(f"{path} is not a reranker checkpoint (no {CONFIG}): train one with `odqa train-reranker`")
        check_sealed(path, "reranker")
        config = read_config(path / CONFIG, CrossEncoderConfig)
        lm = from_pretrained_whole(AutoModelForSequenceClassification, path, "the reranker's weights")
        if lm.config.num_labels != 1:
            raise InputError(f"{path}: the reranker's head has {lm.config.num_labels} outputs, not 1")
        return cls(lm, load_tokenizer(path), config)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as tmp:
            tmp.mkdir()
            self.lm.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            write_json(tmp / CONFIG, asdict(self.config))

    def encode(self, questions: list[str], passages: list[dict]) -> dict[str, torch.Tensor]:
        """Question-passage pairs as model inputs, cut to fit max_tokens from the longer of the two: the passage
        as a rule, and the question too where it alone would not leave room (TriviaQA has 150-token questions)."""
        return self.tokenizer(questions, [passage_input(p) for p in passages], max_length=self.config.max_tokens,
                              truncation="longest_first", padding=True, return_tensors="pt")

    def forward(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """A relevance score for each pair, (n,)."""
        return self.lm(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits[:, 0]

    def is_head(self, name: str) -> bool:
        """Whether parameter `name` is the scoring head's (`classifier`, and BERT's pooler before it, which
        a sentence encoder leaves untrained), not the pretrained encoder's."""
        return ".classifier." in f".{name}" or ".pooler." in f".{name}"

    @torch.no_grad()
    def score(self, question: str, passages: list[dict], batch_size: int = 32) -> np.ndarray:
        """The relevance of each passage to the question, in the passages' order; under bfloat16 autocast
        where the hardware computes it natively (`search_dtype`), as the question encoders and the reader."""
        if not passages:
            return np.zeros(0)
        device = next(self.parameters()).device
        out = []
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=search_dtype(device.type) == torch.bfloat16):
            for a in range(0, len(passages), batch_size):
                chunk = passages[a:a + batch_size]
                enc = {k: v.to(device) for k, v in self.encode([question] * len(chunk), chunk).items()}
                out.append(self(**enc).float().cpu().numpy())
        return np.concatenate(out)

    @property
    def weight(self) -> float:
        """Its score's weight beside the search's in the final ranking (1 where none was tuned)."""
        return 1.0 if self.config.weight is None else float(self.config.weight)


def set_weight(path: str | os.PathLike, weight: float) -> None:
    """Store a tuned ranking weight in the checkpoint at `path`, and seal it again (a checkpoint the loop
    wrote is checked against its checksums)."""
    check_sealed(path, "reranker")      # what was there before the change was whole
    config = replace(read_config(Path(path) / CONFIG, CrossEncoderConfig), weight=float(weight))
    write_json(Path(path) / CONFIG, asdict(config))
    seal(path)

