"""Phrase-model inputs: questions, and passages as `[CLS] title [SEP] text [SEP]` with a mask of the
tokens that may start or end a phrase (text tokens; with `title_phrases` title tokens too, never
special tokens), the character offset of each token in its segment (the text, or the title), and the
gold start/end tokens of every answer occurrence. A phrase lies in one segment: a title phrase is
answered from the title ("Donald Trump", where the lead section says "Donald John Trump").
With `title_path` the title segment is DHR's title path, "title, section, subsection"."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from odqa.common.metrics.has_answer import answer_spans

log = logging.getLogger(__name__)


@dataclass
class EncodedPassages:
    batch: dict                 # input_ids, attention_mask, token_type_ids: (B, T)
    candidate: torch.Tensor     # (B, T) bool: token may be a phrase boundary
    offsets: torch.Tensor       # (B, T, 2) character offsets in the token's segment (0, 0 off the candidates)
    in_title: torch.Tensor      # (B, T) bool: a title token (a candidate only with title_phrases)


def passage_title(passage: dict, title_path: bool) -> str:
    return ", ".join([passage["title"], *passage.get("section", [])]) if title_path else passage["title"]


def encode_passages(tokenizer, titles: list[str], texts: list[str], max_tokens: int,
                    use_title: bool = True, title_phrases: bool = False) -> EncodedPassages:
    first = titles if use_title else texts
    second = texts if use_title else None
    # longest_first cuts only the text while the title is the shorter segment (every real passage),
    # and cuts a title longer than the budget instead of failing the whole batch
    enc = tokenizer(first, second, truncation="longest_first", max_length=max_tokens,
                    padding=True, return_offsets_mapping=True, return_tensors="pt")
    text_seq = 1 if use_title else 0
    seq = torch.tensor([[-1 if s is None else s for s in enc.sequence_ids(b)] for b in range(len(texts))])
    in_title = (seq == 0) if use_title else torch.zeros_like(seq, dtype=torch.bool)
    candidate = (seq == text_seq) | (in_title & title_phrases)
    offsets = enc.pop("offset_mapping") * candidate.unsqueeze(-1)
    return EncodedPassages(batch=dict(enc), candidate=candidate, offsets=offsets, in_title=in_title)


def same_segment(in_title: torch.Tensor) -> torch.Tensor:
    """(..., T) -> (..., T, T): whether tokens i and j lie in the same segment, so (i, j) may be a phrase."""
    return in_title.unsqueeze(-1) == in_title.unsqueeze(-2)


def encode_questions(tokenizer, questions: list[str], max_tokens: int) -> dict:
    return dict(tokenizer(questions, truncation=True, max_length=max_tokens, padding=True, return_tensors="pt"))


def gold_token_spans(offsets: torch.Tensor, candidate: torch.Tensor, char_spans, max_span_len: int):
    """Token (start, end) of each answer character span that survived truncation and fits in L."""
    out = []
    starts, ends = offsets[:, 0].tolist(), offsets[:, 1].tolist()
    cand = candidate.tolist()
    for s, e in char_spans:
        ts = next((i for i, ok in enumerate(cand) if ok and starts[i] <= s < ends[i]), None)
        if ts is None:
            ts = next((i for i, ok in enumerate(cand) if ok and starts[i] >= s), None)
        te = next((j for j in range(len(cand) - 1, -1, -1) if cand[j] and starts[j] < e <= ends[j]), None)
        if te is None:
            te = next((j for j in range(len(cand) - 1, -1, -1) if cand[j] and ends[j] <= e), None)
        if ts is not None and te is not None and 0 <= te - ts < max_span_len:
            out.append((ts, te))
    return out


def gold_spans(passages: EncodedPassages, b: int, example: dict, title: str, max_span_len: int, title_phrases: bool):
    """Passage b's gold (start, end) tokens: its answer occurrences in the text and, with `title_phrases`,
    in the title."""
    cand, in_title = passages.candidate[b], passages.in_title[b]
    spans = gold_token_spans(passages.offsets[b], cand & ~in_title, example["answer_char_spans"], max_span_len)
    if title_phrases:
        in_title_spans = answer_spans(title, example["answers"], example.get("regex", False))
        spans += gold_token_spans(passages.offsets[b], cand & in_title, in_title_spans, max_span_len)
    return spans


def collate(tokenizer, examples: list[dict], max_passage_tokens: int, max_question_tokens: int,
            max_span_len: int, title_path: bool = False, title_phrases: bool = False) -> dict | None:
    """A training batch; examples whose answer was truncated away are dropped (None if none is left).
    An example's `negative_passages` (In-Doc/In-Section negatives: other passages of its document or
    section) come as `negatives` with `negative_owner`, the batch position of their question. Their
    titles are never candidates: a negative passage of the answer's own document shares its title."""
    titles = [passage_title(e, title_path) for e in examples]
    passages = encode_passages(tokenizer, titles, [e["text"] for e in examples], max_passage_tokens,
                               title_phrases=title_phrases)
    gold_start = torch.zeros_like(passages.candidate)
    gold_end = torch.zeros_like(passages.candidate)
    keep = []
    for b, e in enumerate(examples):
        spans = gold_spans(passages, b, e, titles[b], max_span_len, title_phrases)
        for s, t in spans:
            gold_start[b, s] = gold_end[b, t] = True
        if spans:
            keep.append(b)
    if not keep:
        return None
    idx = torch.tensor(keep)
    questions = encode_questions(tokenizer, [examples[b]["question"] for b in keep], max_question_tokens)
    negatives = [(pos, n) for pos, b in enumerate(keep) for n in examples[b].get("negative_passages", [])]
    extra = {}
    if negatives:
        neg = encode_passages(tokenizer, [passage_title(n, title_path) for _, n in negatives],
                              [n["text"] for _, n in negatives], max_passage_tokens)
        extra = {"negatives": neg.batch, "negative_candidate": neg.candidate,
                 "negative_owner": torch.tensor([pos for pos, _ in negatives])}
    return {**extra,
        "questions": questions,
        "passages": {k: v[idx] for k, v in passages.batch.items()},
        "candidate": passages.candidate[idx], "offsets": passages.offsets[idx],
        "gold_start": gold_start[idx], "gold_end": gold_end[idx],
        "texts": [examples[b]["text"] for b in keep], "answers": [examples[b]["answers"] for b in keep],
    }
