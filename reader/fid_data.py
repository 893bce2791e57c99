"""FiD's input: retrieval files in DPR/FiD form, JSON list or JSONL, one question each:

    {"id", "question", "answers": [...], "target"?: str,
     "ctxs": [{"id", "title", "text", "score", "phrase"?: {"text", "score"}}, ...]}

A row of `odqa supervise` (no ctxs: its answer-bearing passage as passage_id, title, text and
answer_char_spans) reads as that one passage, the answer as the passage writes it the target: a
reader's k = 1 practice on the evidence alone (`retrieval_file.gold_entry`).

A question keeps its k best passages by score. Each passage becomes `question: Q title: T context: P`,
truncated to `text_maxlength` tokens; a question with fewer than k passages gets empty ones, masked
out. The target is `target` if given, else the first answer as the k passages write it (with
`random_answer`, one drawn anew each epoch), else the first answer; without a leading article.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from odqa.common.io import InputError, atomic_path, read_json, read_jsonl, require_file
from odqa.common.questions import parse_question
from odqa.common.retrieval_file import gold_entry
from odqa.reader.spans import PassageSpans


@dataclass
class FiDExample:
    id: str
    question: str
    answers: list[str]
    passages: list[tuple[str, str]]     # (title, text), best first
    target: str | None = None
    regex: bool = False
    has_answer: list[bool] | None = None   # per passage, where the retrieval file says
    # per passage, its best phrase's (text, score) where a phrase retrieval file gives one (ctxs[].phrase)
    phrases: list[tuple[str, float] | None] | None = None


def _parse(obj: dict, where: str) -> FiDExample:
    q = parse_question({**obj, "answers": obj.get("answers", [])}, where)   # a file to read may lack answers
    if "ctxs" not in obj and "passage_id" in obj:
        obj = _supervision_entry({**obj, "answers": q.answers}, where)
    ctxs = obj.get("ctxs")
    if not isinstance(ctxs, list):
        raise InputError(f"{where}: needs a \"ctxs\" list (or, as `odqa supervise` writes, a \"passage_id\" "
                         "and its \"text\")")
    for j, c in enumerate(ctxs):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str):
            raise InputError(f"{where}: ctx {j} needs a \"text\"")
        if "score" in c:
            c["score"] = _score(c["score"], f"{where}: ctx {j}")
    if all("score" in c for c in ctxs):
        ctxs = sorted(ctxs, key=lambda c: -c["score"])
    target = obj.get("target")
    return FiDExample(id=q.id, question=q.question, answers=q.answers,
                      passages=[(c.get("title", ""), c["text"]) for c in ctxs],
                      target=target if isinstance(target, str) else None, regex=q.regex,
                      has_answer=[bool(c["has_answer"]) for c in ctxs] if all("has_answer" in c for c in ctxs)
                      else None,
                      phrases=[_phrase(c.get("phrase"), f"{where}: ctx {j}") for j, c in enumerate(ctxs)]
                      if any("phrase" in c for c in ctxs) else None)


def _supervision_entry(row: dict, where: str) -> dict:
    """A row of `odqa supervise` as its one-passage entry, once its passage and spans are checked."""
    text, spans = row.get("text"), row.get("answer_char_spans", [])
    if not isinstance(text, str):
        raise InputError(f"{where}: a supervision row needs its passage's \"text\"")
    if not isinstance(spans, list) or not all(
            isinstance(sp, list) and len(sp) == 2 and all(type(i) is int for i in sp) and 0 <= sp[0] < sp[1] <= len(text)
            for sp in spans):
        raise InputError(f"{where}: \"answer_char_spans\" must be [start, end] character offsets into the text")
    return gold_entry(row)


def _phrase(obj, where: str) -> tuple[str, float] | None:
    """A ctx's best phrase as (text, score); None where the passage has none."""
    if obj is None:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
        raise InputError(f"{where}: \"phrase\" needs a \"text\"")
    return obj["text"], _score(obj.get("score"), f"{where}: phrase")


def _score(value, where: str) -> float:
    """A ctx's retrieval score as a number; DPR's own files write it as a string."""
    try:
        score = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        score = math.nan
    if math.isnan(score):
        raise InputError(f"{where}: \"score\" is not a number: {str(value)[:40]!r}")
    return score


def load_fid_file(path: str | os.PathLike, limit: int | None = None) -> list[FiDExample]:
    path = require_file(path, "FiD file")
    with open(path, "rb") as f:
        first = f.read(4096).lstrip()[:1]
    if first == b"[":
        rows = ((i, obj) for i, obj in enumerate(read_json(path)))
    else:
        rows = read_jsonl(path)
    out = []
    for i, obj in rows:
        if not isinstance(obj, dict):
            raise InputError(f"{path}:{i}: expected a JSON object")
        ex = _parse(obj, f"{path}:{i}")
        ex.id = ex.id or f"{Path(path).stem}-{len(out)}"
        out.append(ex)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError(f"{path}: no questions")
    return out


def encoder_text(question: str, title: str, text: str) -> str:
    return f"question: {question} title: {title} context: {text}"


def passage_fields(question: str, title: str, text: str) -> list[tuple[int, int, str]]:
    """(char start, char end, string) of the title and of the text inside `encoder_text(...)`."""
    t0 = len(f"question: {question} title: ")
    c0 = t0 + len(f"{title} context: ")
    return [(t0, t0 + len(title), title), (c0, c0 + len(text), text)]


def answer_end_id(tokenizer) -> int:
    """The token that ends a target: T5's </s>, BERT's [SEP]."""
    return tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id


_LEADING_ARTICLE = re.compile(r"^(the|a|an)\s+(?=\S)", re.IGNORECASE)


def strip_article(answer: str) -> str:
    """"the Saint Lawrence River" -> "Saint Lawrence River": EM (SQuAD's normalisation) drops articles,
    so a reader that spends its first token on one learns nothing that scores."""
    return _LEADING_ARTICLE.sub("", answer.strip())


def answers_in_passages(ex: FiDExample, k: int) -> list[str]:
    """The gold answers as the first k passages write them (answer-bearing passages only, where the file
    says which), best passage first: "Peking" for the gold "peking", the alias a TriviaQA passage uses."""
    found = []
    for j, (title, text) in enumerate(ex.passages[:k]):
        if ex.has_answer is not None and not ex.has_answer[j]:
            continue
        for answer in ([] if ex.regex else ex.answers):
            m = re.search(r"(?<!\w)" + re.escape(answer.strip()) + r"(?!\w)", f"{title}\n{text}", re.IGNORECASE)
            if m and answer.strip() and m.group(0) not in found:
                found.append(m.group(0))
    return found


def pick_target(ex: FiDExample, rng: random.Random | None, k: int | None = None) -> str:
    """`target` if the file gives one; else an answer as the passages write it (first found, or, with
    `rng`, one drawn at random), else as the file gives it. Without a leading article."""
    if ex.target is not None:
        return strip_article(ex.target)
    if not ex.answers:
        raise InputError(f"question {ex.id!r} has no answer to train on")
    pool = answers_in_passages(ex, k if k is not None else len(ex.passages)) or ex.answers
    return strip_article(rng.choice(pool) if rng is not None else pool[0])


class FiDCollator:
    """Examples -> input_ids/attention_mask (B, k, L) and labels (B, T) with -100 on padding."""

    def __init__(self, tokenizer, k: int, text_maxlength: int = 200, max_new_tokens: int = 32,
                 span_loss: bool = False):
        self.tokenizer = tokenizer
        self.k = k
        self.text_maxlength = text_maxlength
        self.max_new_tokens = max_new_tokens
        self.span_loss = span_loss

    def encode_passages(self, examples: list[FiDExample], offsets: bool = False) -> dict:
        """input_ids/attention_mask (B, k, L); with `offsets`, also each token's character span
        (`offset_mapping`, B x k x L x 2) and each passage's title and text spans (`fields`), what
        reader.spans needs to map tokens back to the passages' strings."""
        texts, present, fields = [], [], []
        for ex in examples:
            ps = ex.passages[: self.k]
            texts += [encoder_text(ex.question, t, p) for t, p in ps] + [""] * (self.k - len(ps))
            present += [1] * len(ps) + [0] * (self.k - len(ps))
            fields.append([passage_fields(ex.question, t, p) for t, p in ps])
        enc = self.tokenizer(texts, max_length=self.text_maxlength, truncation=True, padding="longest",
                             return_tensors="pt", return_offsets_mapping=offsets)
        mask = enc["attention_mask"] * torch.tensor(present).unsqueeze(1)
        b = len(examples)
        out = {"input_ids": enc["input_ids"].view(b, self.k, -1), "attention_mask": mask.view(b, self.k, -1)}
        if offsets:
            out["offset_mapping"] = enc["offset_mapping"].view(b, self.k, -1, 2)
            out["fields"] = fields
        return out

    def encode_targets(self, targets: list[str]) -> torch.Tensor:
        """Labels (B, T): the answer's tokens and the end token, -100 on padding. Special tokens other
        than the end are left out: the decoder's start token is prepended by the model."""
        end = answer_end_id(self.tokenizer)
        ids = [seq[: self.max_new_tokens - 1] + [end] for seq in
               self.tokenizer(targets, add_special_tokens=False)["input_ids"]]
        width = max(len(seq) for seq in ids)
        return torch.tensor([seq + [-100] * (width - len(seq)) for seq in ids])

    def __call__(self, examples: list[FiDExample], rng: random.Random | None = None) -> dict[str, torch.Tensor]:
        batch = self.encode_passages(examples, offsets=self.span_loss)
        batch["labels"] = self.encode_targets([pick_target(ex, rng, self.k) for ex in examples])
        if all(ex.has_answer is not None for ex in examples):
            # what a reader with a passage prior learns its passage scores from; other readers ignore it
            batch["passage_labels"] = torch.tensor([[int(h) for h in (ex.has_answer + [False] * self.k)[: self.k]]
                                                    for ex in examples])
        if self.span_loss:
            batch["label_allowed"] = self.allowed_tokens(batch.pop("offset_mapping"), batch.pop("fields"), batch)
        return batch

    def allowed_tokens(self, offsets, fields, batch) -> torch.Tensor:
        """(B, T, A) for `span_loss`: at each target step, the tokens span-constrained decoding may choose
        after the target's prefix (and the target's own token); -1 rows where the target is no span of
        the passages, which those steps then learn over the whole vocabulary."""
        end = answer_end_id(self.tokenizer)
        spans = PassageSpans(batch["input_ids"], offsets, fields, end, self.tokenizer.pad_token_id)
        rows = []
        for b, labels in enumerate(batch["labels"].tolist()):
            target = [t for t in labels if t != -100]
            answer = target[:-1] if target and target[-1] == end else target
            if spans.surface(b, answer) is None:
                rows.append([[] for _ in labels])
                continue
            rows.append([sorted(set(spans.allowed(b, target[:t])) | {target[t]}) if t < len(target) else []
                         for t in range(len(labels))])
        width = max(1, max(len(a) for row in rows for a in row))
        return torch.tensor([[a + [-1] * (width - len(a)) for a in row] for row in rows])


def write_predictions(path: str | os.PathLike, examples: list[FiDExample], predictions: list[str],
                      correct: list[bool]) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for ex, pred, ok in zip(examples, predictions, correct):
            f.write(json.dumps({"id": ex.id, "question": ex.question, "answers": ex.answers, "prediction": pred,
                                "em": ok}, ensure_ascii=False) + "\n")
