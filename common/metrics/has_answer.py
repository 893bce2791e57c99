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
from typing import Sequence

import regex

from common.metrics.answers import compile_answer_regex

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


def _token_spans(passage_tokens: list[tuple[str, int, int]], answer: str) -> list[tuple[int, int]]:
    words = [t for t, _, _ in passage_tokens]
    ans = [t for t, _, _ in dpr_tokenize(answer)]
    if not ans:
        return []
    n = len(ans)
    return [
        (passage_tokens[i][1], passage_tokens[i + n - 1][2])
        for i in range(len(words) - n + 1)
        if words[i : i + n] == ans
    ]


def _regex_spans(text: str, pattern: str) -> list[tuple[int, int]]:
    norm, source = _nfd_with_offsets(text)
    try:
        compiled = compile_answer_regex(pattern)
    except ValueError:
        return []  # DPR treats an answer regex that does not compile as matching nothing
    return [(source[m.start()], source[m.end() - 1] + 1) for m in compiled.finditer(norm) if m.end() > m.start()]


def answer_spans(text: str, answers: Sequence[str], regex_answers: bool = False,
                 tokens: list[tuple[str, int, int]] | None = None) -> list[tuple[int, int]]:
    """Character spans in `text` where any answer occurs, sorted and de-duplicated.
    Pass `tokens=dpr_tokenize(text)` to reuse a tokenisation across calls."""
    spans: set[tuple[int, int]] = set()
    if regex_answers:
        for pattern in answers:
            spans.update(_regex_spans(text, pattern))
    else:
        tokens = dpr_tokenize(text) if tokens is None else tokens
        for answer in answers:
            spans.update(_token_spans(tokens, answer))
    return sorted(spans)


def has_answer(text: str, answers: Sequence[str], regex_answers: bool = False,
               tokens: list[tuple[str, int, int]] | None = None) -> bool:
    return bool(answer_spans(text, answers, regex_answers, tokens))
