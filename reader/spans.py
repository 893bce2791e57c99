"""Answers in the passages' own words: span-constrained decoding and the surface string of an answer.

An uncased WordPiece decoder lowercases, strips accents and splits numbers ("rontgen", "1. 71"), and
SQuAD's EM keeps accents, so a generated answer is mapped back to the characters of the passage it
came from through the tokenizer's offsets. With `spans` decoding the decoder may only continue
a span of an input passage (its title or its text, never the question): the first token starts a
word and is no article (EM drops articles, and the reader is trained without them), the answer ends
at a word boundary, and it may not end while it holds nothing but punctuation (an answer SQuAD's
normalisation makes empty).

`PassageSpans` holds, per question, every passage token of the encoder input with its offsets;
`allowed(b, prefix)` is what `generate(prefix_allowed_tokens_fn=...)` asks for, and `surface(b, ids)`
gives the passage's string for a generated token sequence, or None where it is no passage span.
`ban_first(b, token)` takes a first token out of question b's choices, so that an answer can be
decoded again without it (reader.read does so for answers that only repeat the question).
"""
from __future__ import annotations

import numpy as np

from odqa.common.metrics.answers import normalize_answer

_ARTICLES = {"a", "an", "the"}


class _Example:
    """One question's passage tokens, end to end, each field followed by a -1 separator."""

    def __init__(self, ids: list[int], texts: list[str], spans: list[tuple[int, int]], start_ok: list[bool],
                 end_ok: list[bool], content: list[bool], field: list[int]):
        self.ids = np.array(ids + [-1], dtype=np.int64)
        self.texts = texts                      # field index -> its text
        self.spans = spans                      # position -> (char start, char end) in its field's text
        self.start_ok = np.array(start_ok + [False])
        self.end_ok = np.array(end_ok + [False])
        self.content = np.array(content + [False])
        self.field = field
        starts = np.flatnonzero(self.start_ok)
        self.first: dict[int, np.ndarray] = {}
        for token in np.unique(self.ids[starts]):
            self.first[int(token)] = starts[self.ids[starts] == token]

    def matches(self, prefix: list[int]) -> np.ndarray:
        """Start positions of the passage spans that begin with `prefix` (non-empty)."""
        pos = self.first.get(prefix[0], np.empty(0, dtype=np.int64))
        for t, token in enumerate(prefix[1:], 1):
            pos = pos[pos + t < len(self.ids)]
            pos = pos[self.ids[pos + t] == token]
        return pos


def _word_boundaries(text: str, offsets: list[tuple[int, int]]) -> tuple[list[bool], list[bool]]:
    """For each token, whether a span may start at it and end after it: a gap in the text or punctuation
    lies between tokens, but not the '.' of '1.71' or the '-' of 'e-mail' (punctuation between two
    word characters with no space)."""
    n = len(offsets)
    punct = [not any(ch.isalnum() for ch in text[s:e]) for s, e in offsets]
    joined = [offsets[i][1] == offsets[i + 1][0] for i in range(n - 1)]
    inner = [punct[i] and 0 < i < n - 1 and joined[i - 1] and joined[i] and not punct[i - 1] and not punct[i + 1]
             for i in range(n)]

    def boundary(i: int) -> bool:   # between token i and i + 1
        return not joined[i] or ((punct[i] or punct[i + 1]) and not inner[i] and not inner[i + 1])

    article = [text[s:e].lower() in _ARTICLES for s, e in offsets]
    start_ok = [not punct[i] and not article[i] and (i == 0 or boundary(i - 1)) for i in range(n)]
    end_ok = [not punct[i] and (i == n - 1 or boundary(i)) for i in range(n)]
    return start_ok, end_ok


class PassageSpans:
    def __init__(self, input_ids, offsets, fields: list[list[list[tuple[int, int, str]]]], eos_id: int,
                 pad_id: int | None):
        """`input_ids` (B, k, L) and `offsets` (B, k, L, 2) of the encoder input; `fields[b][j]` lists
        (char start, char end, text) of passage j's title and text inside its encoder string."""
        self.eos, self.pad = eos_id, pad_id
        self.examples = []
        self.banned: list[set[int]] = [set() for _ in fields]
        for b in range(len(fields)):
            ids, texts, spans, start_ok, end_ok, content, field_of = [], [], [], [], [], [], []
            for j, passage_fields in enumerate(fields[b]):
                row_ids, row_off = input_ids[b][j].tolist(), offsets[b][j].tolist()
                for lo, hi, text in passage_fields:
                    keep = [(t, s - lo, e - lo) for t, (s, e) in zip(row_ids, row_off) if e > s and lo <= s and e <= hi]
                    if not keep:
                        continue
                    f = len(texts)
                    texts.append(text)
                    offs = [(s, e) for _, s, e in keep]
                    so, eo = _word_boundaries(text, offs)
                    ids += [t for t, _, _ in keep] + [-1]
                    spans += offs + [(0, 0)]
                    start_ok += so + [False]
                    end_ok += eo + [False]
                    content += [normalize_answer(text[s:e]) != "" for s, e in offs] + [False]
                    field_of += [f] * len(keep) + [-1]
            self.examples.append(_Example(ids, texts, spans, start_ok, end_ok, content, field_of))

    def allowed(self, b: int, prefix: list[int]) -> list[int]:
        """Tokens that may follow `prefix` (the answer so far, without the decoder's start token)."""
        ex = self.examples[b]
        if self.eos in prefix or (self.pad is not None and self.pad in prefix):   # a finished sequence
            return [self.eos] + ([self.pad] if self.pad is not None else [])
        if not prefix:
            return [t for t in ex.first if t not in self.banned[b]] or [self.eos]
        pos = ex.matches(prefix)
        if len(pos) == 0:
            return [self.eos]
        m = len(prefix)
        nxt = ex.ids[pos + m]          # in range: every field, the last too, ends in a -1 separator
        out = {int(t) for t in nxt[nxt >= 0]}
        has_content = ex.content[pos[:, None] + np.arange(m)].any(axis=1)
        if (ex.end_ok[pos + m - 1] & has_content).any() or not out:
            out.add(self.eos)
        return sorted(out)

    def ban_first(self, b: int, token: int) -> None:
        self.banned[b].add(int(token))

    def surface(self, b: int, answer_ids: list[int]) -> str | None:
        """The passage string a generated answer spells (the first passage's, preferring a span that ends
        on a word boundary), or None."""
        ex = self.examples[b]
        if not answer_ids:
            return None
        pos = ex.matches(answer_ids)
        if len(pos) == 0:
            return None
        m = len(answer_ids)
        whole = pos[ex.end_ok[pos + m - 1]]
        j = int((whole if len(whole) else pos)[0])
        start, end = ex.spans[j][0], ex.spans[j + m - 1][1]
        return ex.texts[ex.field[j]][start:end]


def strip_generated(ids: list[int], eos_id: int, pad_id: int | None, start_id: int) -> list[int]:
    """The answer's tokens of a generated row: after the decoder's start token, up to the end token."""
    if ids and ids[0] == start_id:
        ids = ids[1:]
    out = []
    for t in ids:
        if t == eos_id or (pad_id is not None and t == pad_id):
            break
        out.append(t)
    return out
