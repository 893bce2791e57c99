"""A cross-encoder span reader, the phrase model's teacher (DensePhrases, Lee et al. ACL 2021, Sec. 4.2:
distillation from a cross-attention model). It reads `[CLS] question [SEP] title [SEP] text [SEP]`
together, BERT's SQuAD head (`AutoModelForQuestionAnswering`) gives a start and an end logit per token,
and those logits are read off at the positions of the phrase model's own passage tokens, so the two
models' distributions over a passage line up token for token. It shares the phrase model's tokenizer."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForQuestionAnswering

from odqa.common.io import InputError, atomic_path
from odqa.common.weights import UNUSED_EXTRA, UNUSED_MISSING, check_sealed, from_pretrained_whole
from odqa.retriever.lm import load_tokenizer


def cross_inputs(questions: dict, passages: dict) -> dict:
    """The teacher's inputs from the phrase model's: each question's tokens (with its [CLS] and [SEP]),
    then its passage's tokens after the passage's [CLS]; `position` (B, T) is where each passage token
    sits in the joint sequence (the passage's [CLS] maps to the joint [CLS])."""
    q_len = questions["attention_mask"].sum(1)
    p_len = passages["attention_mask"].sum(1)
    B, T = passages["input_ids"].shape
    width = int((q_len + p_len - 1).max())
    ids = torch.zeros((B, width), dtype=torch.long)
    types = torch.zeros_like(ids)
    position = torch.zeros((B, T), dtype=torch.long)
    for b in range(B):
        q, p = int(q_len[b]), int(p_len[b])
        ids[b, :q] = questions["input_ids"][b, :q]
        ids[b, q:q + p - 1] = passages["input_ids"][b, 1:p]
        types[b, q:q + p - 1] = 1
        position[b, 1:p] = torch.arange(q, q + p - 1)
    mask = (torch.arange(width).unsqueeze(0) < (q_len + p_len - 1).unsqueeze(1)).long()
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "position": position}


class SpanTeacher(nn.Module):
    def __init__(self, qa: nn.Module):
        super().__init__()
        self.qa = qa

    @classmethod
    def from_encoder(cls, name_or_path: str | os.PathLike) -> "SpanTeacher":
        """A new teacher: a BERT-family encoder with a fresh span head."""
        return cls(from_pretrained_whole(AutoModelForQuestionAnswering, name_or_path, "a language model's weights",
                                         may_lack=("qa_outputs.", *UNUSED_MISSING), may_add=UNUSED_EXTRA))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "SpanTeacher":
        path = Path(path)
        if not (path / "config.json").exists() or not (path / "tokenizer").exists():
            raise InputError(f"{path} is not a span-teacher checkpoint (`odqa train-teacher` OUT/best)")
        check_sealed(path, "span teacher")
        teacher = cls(from_pretrained_whole(AutoModelForQuestionAnswering, path, "the span teacher's weights",
                                            may_lack=UNUSED_MISSING))
        if teacher.qa.qa_outputs.out_features != 2:
            raise InputError(f"{path}: the span head has {teacher.qa.qa_outputs.out_features} outputs, not 2")
        return teacher

    def save_pretrained(self, out_dir: str | os.PathLike, tokenizer) -> None:
        with atomic_path(out_dir) as tmp:
            self.qa.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp / "tokenizer")

    def forward(self, questions: dict, passages: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Start and end logits at the phrase model's passage positions: (B, T) each."""
        joint = cross_inputs(questions, passages)
        limit = self.qa.config.max_position_embeddings
        if joint["input_ids"].shape[1] > limit:
            raise InputError(f"question and passage together are {joint['input_ids'].shape[1]} tokens, more than the "
                             f"teacher's {limit} positions: lower --max-passage-tokens or --max-question-tokens")
        position = joint.pop("position").to(self.qa.device)
        out = self.qa(**{k: v.to(self.qa.device) for k, v in joint.items()})
        return out.start_logits.float().gather(1, position), out.end_logits.float().gather(1, position)


def same_vocabulary(teacher_dir: str | os.PathLike, student_tokenizer) -> None:
    """Distillation lines tokens up by position, so both must cut text the same way."""
    if load_tokenizer(teacher_dir).get_vocab() != student_tokenizer.get_vocab():
        raise InputError(f"{teacher_dir}: the teacher's vocabulary is not the phrase model's; train the teacher "
                         "from the same encoder family")
