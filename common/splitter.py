"""Split a section's text into disjoint passages of at most `max_words` white-space words.

Sentences are packed greedily into a passage while it stays within the bound, so passages end at
sentence boundaries where possible; a single sentence longer than the bound is cut into equal parts
at word boundaries. Returns character spans into the text, so `text[start:end]` is the passage.
"""
from __future__ import annotations

import re

_WORD = re.compile(r"\S+")
_SENTENCE_END = re.compile(r"""[.!?]["'”’)\]]*$""")
# Words ending in a period that rarely end a sentence: titles, initials, common abbreviations.
_NO_BREAK = re.compile(r"^(?:[A-Z]|Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|vs|etc|e\.g|i\.e|U\.S|No|Vol|Fig|Inc|Co|Ltd|Mt|c|ca)\.$")


def sentence_breaks(text: str, words: list[re.Match]) -> list[int]:
    """Indices i such that a sentence ends after word i (the last word always ends one)."""
    breaks = []
    for i, w in enumerate(words[:-1]):
        token = w.group()
        gap = text[w.end():words[i + 1].start()]
        if "\n" in gap:
            breaks.append(i)
        elif _SENTENCE_END.search(token) and not _NO_BREAK.match(token):
            nxt = words[i + 1].group()
            if nxt[0].isupper() or nxt[0].isdigit() or nxt[0] in "\"'“‘(":
                breaks.append(i)
    if words:
        breaks.append(len(words) - 1)
    return breaks


def split_passages(text: str, max_words: int = 100) -> list[tuple[int, int]]:
    if max_words < 1:
        raise ValueError("max_words must be positive")
    words = list(_WORD.finditer(text))
    if not words:
        return []
    sentences, start = [], 0
    for end in sentence_breaks(text, words):
        sentences.append((start, end + 1))  # word index range [start, end+1)
        start = end + 1

    chunks: list[tuple[int, int]] = []  # word index ranges
    cur_start = cur_end = None
    for s, e in sentences:
        if cur_start is not None and e - cur_start <= max_words:
            cur_end = e
            continue
        if cur_start is not None:
            chunks.append((cur_start, cur_end))
        if e - s <= max_words:
            cur_start, cur_end = s, e
        else:
            n_parts = -(-(e - s) // max_words)
            bounds = [s + (e - s) * k // n_parts for k in range(n_parts + 1)]
            chunks.extend(zip(bounds[:-1], bounds[1:]))
            cur_start = cur_end = None
    if cur_start is not None:
        chunks.append((cur_start, cur_end))
    return [(words[a].start(), words[b - 1].end()) for a, b in chunks]
