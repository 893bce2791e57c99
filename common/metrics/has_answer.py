"""DPR's `has_answer`: does a passage contain one of the answers?

Text and answers are put in Unicode NFD and split into DPR's SimpleTokenizer tokens
(`[\\p{L}\\p{N}\\p{M}]+` runs, or any single character that is not white space or a control
character), lower-cased; a passage has the answer when the answer's token sequence occurs
contiguously in the passage text. The title is not searched. Regex answers (CuratedTREC) are
searched, case-insensitively, in the NFD text.

Offsets come back in characters of the text as given, so spans index the original passage.
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache
from typing import Sequence

import regex

from odqa.common.metrics.answers import compile_answer_regex

_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", flags=regex.UNICODE)


def _nfd_with_offsets(text: str) -> tuple[str, list[int]]:
    """NFD text and, for each of its characters, the index of the source character."""
    if unicodedata.is_normalized("NFD", text):
        return text, list(range(len(text)))
    chars, source = [], []
    for i, ch in enumerate(text):
        norm = unicodedata.normalize("NFD", ch)
        chars.append(norm)
        source.extend([i] * len(norm))
    return "".join(chars), source


def dpr_tokenize(text: str) -> list[tuple[str, int, int]]:
    """(lower-cased token, start, end) with start/end in characters of `text`."""
    norm, source = _nfd_with_offsets(text)
    out = []
    for m in _TOKEN.finditer(norm):
        start, end = source[m.start()], source[m.end() - 1] + 1
        out.append((m.group().lower(), start, end))
    return out


class TokenizedText:
    """A passage's DPR tokens with, for each token, where it occurs: an answer whose first token is
    absent is rejected at once, which matters for TriviaQA's dozens of aliases per question."""

    __slots__ = ("words", "spans", "positions")

    def __init__(self, text: str):
        tokens = dpr_tokenize(text)
        self.words = [t for t, _, _ in tokens]
        self.spans = [(s, e) for _, s, e in tokens]
        self.positions: dict[str, list[int]] = {}
        for i, w in enumerate(self.words):
            self.positions.setdefault(w, []).append(i)

    def find(self, answer_words: tuple[str, ...]) -> list[tuple[int, int]]:
        """Character spans where the token sequence occurs."""
        n = len(answer_words)
        if not n:
            return []
        return [(self.spans[i][0], self.spans[i + n - 1][1]) for i in self.positions.get(answer_words[0], ())
                if tuple(self.words[i:i + n]) == answer_words]


@lru_cache(maxsize=65536)
def answer_words(answer: str) -> tuple[str, ...]:
    return tuple(t for t, _, _ in dpr_tokenize(answer))


def _compiled_or_none(pattern: str):
    try:
        return compile_answer_regex(pattern)
    except ValueError:
        return None  # DPR treats an answer regex that does not compile as matching nothing


def _regex_spans(text: str, pattern: str) -> list[tuple[int, int]]:
    norm, source = _nfd_with_offsets(text)
    compiled = _compiled_or_none(pattern)
    if compiled is None:
        return []
    return [(source[m.start()], source[m.end() - 1] + 1) for m in compiled.finditer(norm) if m.end() > m.start()]


def answer_spans(text: str, answers: Sequence[str], regex_answers: bool = False,
                 tokens: TokenizedText | None = None) -> list[tuple[int, int]]:
    """Character spans in `text` where any answer occurs, sorted and de-duplicated.
    Pass `tokens=TokenizedText(text)` to reuse a tokenisation across calls."""
    spans: set[tuple[int, int]] = set()
    if regex_answers:
        for pattern in answers:
            spans.update(_regex_spans(text, pattern))
    else:
        tokens = TokenizedText(text) if tokens is None else tokens
        for answer in answers:
            spans.update(tokens.find(answer_words(answer)))
    return sorted(spans)


def has_answer(text: str, answers: Sequence[str], regex_answers: bool = False,
               tokens: TokenizedText | None = None) -> bool:
    if regex_answers:  # DPR: `pattern.search(text) is not None`, so an empty match counts too
        norm = unicodedata.normalize("NFD", text)
        patterns = [c for c in map(_compiled_or_none, answers) if c is not None]
        return any(c.search(norm) is not None for c in patterns)
    return bool(answer_spans(text, answers, tokens=tokens))
