"""`--decoding phrases`: the reader chooses among the retriever's phrases and its own answer.

R2-D2 (Fajcik et al., 2021) fuses an extractive and a generative reader by scoring candidate answers
with both. Here the candidates are the span-constrained greedy answer and each of the k passages'
best phrase (one per normalised string, leading article stripped), and each is scored

    log p_reader(c | the k passages) / tokens(c)
        + WEIGHT * (max phrase score of c - logsumexp of the k best phrases' scores) / TEMPERATURE

with the reader's teacher-forced likelihood over the encoder output the greedy answer was decoded
from (the decoder alone runs again). A candidate no passage's best phrase spells gets FLOOR for the
second term. The phrase model gives the boundaries and the reader judges the fit to the question:
greedy decoding commits to its first token, and the span it ends with is often one the reader scores
lower per token than a phrase the phrase model found (docs/notes/reader.md, "Answer fusion"; the constants
were picked on the full preset's validation questions).
"""
from __future__ import annotations

import math

import torch

from odqa.common.io import InputError
from odqa.common.metrics.answers import normalize_answer
from odqa.reader.fid import FusedEncoderOutput, decoder_start_id
from odqa.reader.fid_data import FiDCollator, FiDExample, strip_article

WEIGHT, TEMPERATURE, FLOOR = 0.5, 2.0, -3.0


def check_phrases(examples: list[FiDExample], where: str = "the reader's input") -> None:
    """Phrase decoding needs each question's passages with their best phrases (a phrase retrieval file)."""
    for ex in examples:
        if ex.phrases is None:
            raise InputError(f"decoding 'phrases' needs each passage's best phrase (ctxs[].phrase, as phrase "
                             f"retrieval writes it); question {ex.id!r} of {where} has none")


def candidates(example: FiDExample, generated: str, k: int) -> list[tuple[str, float | None]]:
    """(text, phrase term or None) of each distinct candidate: the passages' phrases in passage order, then the
    generated answer where no phrase spells it. A phrase that normalises to nothing ("the") is none."""
    phrases = [(text, s / TEMPERATURE, _key(text)) for text, s in (p for p in (example.phrases or [])[:k] if p is not None)]
    phrases = [p for p in phrases if p[2]]
    norm = torch.logsumexp(torch.tensor([s for _, s, _ in phrases], dtype=torch.float64), 0).item() if phrases else 0.0
    best: dict[str, tuple[str, float]] = {}   # key -> (its first phrase's text, its best phrase term)
    for text, s, key in phrases:
        best[key] = (best[key][0], max(best[key][1], s - norm)) if key in best else (text, s - norm)
    out: list[tuple[str, float | None]] = list(best.values())
    if _key(generated) and _key(generated) not in best:
        out.append((generated, None))
    return out


def _key(text: str) -> str:
    return normalize_answer(strip_article(text))


@torch.no_grad()
def choose(model, tokenizer, encoded: FusedEncoderOutput, mask: torch.Tensor, examples: list[FiDExample],
           generated: list[str], k: int, max_new_tokens: int = 32) -> list[str]:
    """Each row's best candidate (see the module's docstring). `encoded`/`mask`: the k passages' fused
    encoder output and its (B, k * L) mask, as the greedy answers were decoded from."""
    rows, texts, prior = [], [], []
    for r, (ex, g) in enumerate(zip(examples, generated)):
        for text, term in candidates(ex, g, k):
            rows.append(r)
            texts.append(text)
            prior.append(FLOOR if term is None else term)
    if not rows:
        return list(generated)
    likelihood = _per_token_log_likelihood(model, tokenizer, encoded, mask, rows, texts, max_new_tokens)
    score = likelihood + WEIGHT * torch.tensor(prior)
    out = list(generated)
    best = [-math.inf] * len(examples)
    for i, r in enumerate(rows):
        if score[i] > best[r]:
            best[r], out[r] = float(score[i]), texts[i]
    return out


@torch.no_grad()
def _per_token_log_likelihood(model, tokenizer, encoded, mask, rows, texts, max_new_tokens) -> torch.Tensor:
    """Mean log-probability of each text's tokens and end, read from row rows[i] of the encoder output.
    The decoder's cross-attention keys and values of a row are computed once, at the start token, and
    copied for its candidates: computed for each candidate instead, they made reading take 2.7 times as
    long (docs/notes/reader.md)."""
    targets = FiDCollator(tokenizer, 1, max_new_tokens=max_new_tokens)    # the labels training builds
    start = decoder_start_id(model)
    out = torch.empty(len(texts))
    for r in sorted(set(rows)):
        sel = [i for i, row in enumerate(rows) if row == r]
        n = len(sel)
        labels = targets.encode_targets([strip_article(texts[i]) for i in sel]).to(mask.device)
        one = FusedEncoderOutput(last_hidden_state=encoded.last_hidden_state[r:r + 1],
                                 input_ids=encoded.input_ids[r:r + 1], passage_length=encoded.passage_length)
        first = model(encoder_outputs=one, attention_mask=mask[r:r + 1],
                      decoder_input_ids=torch.tensor([[start]], device=mask.device), use_cache=True)
        cache = first.past_key_values
        cache.batch_repeat_interleave(n)
        many = FusedEncoderOutput(last_hidden_state=one.last_hidden_state.expand(n, -1, -1),
                                  input_ids=one.input_ids.expand(n, -1), passage_length=one.passage_length)
        rest = model(encoder_outputs=many, attention_mask=mask[r:r + 1].expand(n, -1),
                     decoder_input_ids=labels[:, :-1].clamp_min(0), past_key_values=cache, use_cache=True)
        logits = torch.cat([first.logits.float().expand(n, -1, -1), rest.logits.float()], 1)
        present = labels != -100
        token_lp = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
        out[sel] = ((token_lp * present).sum(-1) / present.sum(-1)).cpu()
    return out
