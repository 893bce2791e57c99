"""Phrase search over the index (DensePhrases): the phrases of a question, and the passages (documents)
they rank.

Top-k' MIPS over start vectors and over end vectors; for each start hit the best end within L tokens
of the same passage, for each end hit the best start (L: the index's, or a shorter `max_answer_tokens`
at search time); score = start + end, both read back from the index (decoded from the codes for
SQ/PQ); duplicates merged. A passage's score is the max of its phrases' scores ("Phrase Retrieval
Learns Passage Retrieval, Too", Eq. 3), a document's the max of its passages'. Behind the pre-filter
(retriever/prefilter.py) every token of the question's documents is paired with its best end instead
(`every_phrase`).

The phrase a passage (document) shows, its extractive answer, is its best span that `can_answer`: whole
words, with no word of the question at either edge. The encoders score spans that repeat the question
high ("the Sava" for "... the River Sava and which other river?", "Yamuna river" for "... on the banks
of which river"); when a passage's best hit is one, every span of the passage within the cap is scored
from the index and the best that can answer is shown instead (`best_spans`). Passage scores and their
order do not change.

With a phrase model trained with title phrases, a passage's title tokens are indexed beside its text
tokens: a phrase lies in the title or in the text, never across the two, and a title phrase's text is
read from the title.
"""
from __future__ import annotations

import re

import numpy as np

from odqa.common.io import InputError
from odqa.common.metrics.answers import echoes_at_edge
from odqa.common.results import Document, Passage, Phrase
from odqa.common.timings import stage
from odqa.retriever.results import Hit
from odqa.retriever.search_config import AnswerConfig, PhraseSearchConfig


class Phrases:
    """One question's phrases, best first, held as arrays (vector ids, passage rows, offsets)."""

    def __init__(self, score, start_vec, end_vec, row, char_start, char_end, in_title):
        self.score, self.start_vec, self.end_vec = score, start_vec, end_vec
        self.row, self.char_start, self.char_end, self.in_title = row, char_start, char_end, in_title

    def __len__(self) -> int:
        return len(self.score)

    def __getitem__(self, which) -> "Phrases":
        """The phrases at these positions (a slice or indices); one position gives a phrase of one."""
        if isinstance(which, (int, np.integer)):
            which = slice(int(which), int(which) + 1)
        return Phrases(*(a[which] for a in self.arrays()))

    def arrays(self) -> tuple:
        return self.score, self.start_vec, self.end_vec, self.row, self.char_start, self.char_end, self.in_title

    def at(self, i: int) -> tuple:
        """(score, start id, end id, row, char start, char end, in title) of the i-th, as Python values."""
        return (float(self.score[i]), *(int(a[i]) for a in self.arrays()[1:-1]), bool(self.in_title[i]))

    @staticmethod
    def empty() -> "Phrases":
        none = np.zeros(0, np.int64)
        return Phrases(np.zeros(0, np.float32), *(none,) * 5, np.zeros(0, bool))


class PhraseSearch:
    """Phrase search over `artifacts` (retriever/search_artifacts.py) by `config` (its cap at most the index's L)."""

    def __init__(self, artifacts, config: PhraseSearchConfig):
        L = artifacts.index.max_span_len
        self.artifacts, self.config = artifacts, config
        self.max_len = min(config.max_answer_tokens or L, L)

    # --- the phrases ------------------------------------------------------------------------------
    def mips(self, q_start: np.ndarray, q_end: np.ndarray, k: int) -> list[Phrases]:
        """Top phrases per question, best first, from k start hits and k end hits of one batched MIPS."""
        ix = self.artifacts.index
        k = min(k, ix.manifest["vectors"])
        q_start = np.ascontiguousarray(q_start, dtype=np.float32)
        q_end = np.ascontiguousarray(q_end, dtype=np.float32)
        _, start_hits = ix.search("start", q_start, k)
        _, end_hits = ix.search("end", q_end, k)
        return [self._phrases_of(q_start[i], q_end[i], start_hits[i], end_hits[i]) for i in range(len(q_start))]

    @stage("phrase search")
    def deep_enough(self, q_start: np.ndarray, q_end: np.ndarray, k: int, unit: str, table,
                    max_phrases: int | None = None) -> list[Phrases]:
        """Each question's phrases from MIPS deep enough for k distinct passages (documents): k' starts at
        2k and doubles, only for the questions still short, up to `max_phrases` (default 64k) hits a side;
        a question whose phrases sit in fewer than k passages even then gets fewer, which bounds the cost
        of very peaked questions."""
        out: list[Phrases | None] = [None] * len(q_start)
        todo, kk = np.arange(len(q_start)), 2 * k
        cap = min(max_phrases or 64 * k, self.artifacts.index.manifest["vectors"])
        while len(todo):
            again = []
            for qi, ph in zip(todo, self.mips(q_start[todo], q_end[todo], kk)):
                if unit == "phrase" or len(group(ph, unit, table)[0]) >= k or kk >= cap:
                    out[qi] = ph
                else:
                    again.append(qi)
            todo, kk = np.asarray(again, dtype=np.int64), kk * 2
        return out

    @stage("phrase search")
    def every_phrase(self, qs: np.ndarray, qe: np.ndarray, ids: np.ndarray) -> Phrases:
        """Each of `ids` (whole passages, each in id order) as a start, with its best end within the
        span limit: the best phrase starting there. A passage's best phrase is the best of its own."""
        index, L = self.artifacts.index, self.max_len
        meta = index.meta
        start, end = index.scores("start", ids, qs), index.scores("end", ids, qe)
        self._check_scores(start, end)
        rows, tokens, title = meta["passage_row"][ids], meta["token"][ids].astype(np.int32), meta["in_title"][ids]
        n = len(ids)
        at = np.arange(n)
        fwd = np.minimum(at[:, None] + np.arange(L), n - 1)   # positions in ids, a passage's consecutive
        ok = (rows[fwd] == rows[:, None]) & (tokens[fwd] - tokens[:, None] < L) & (title[fwd] == title[:, None])
        ends = np.where(ok, end[fwd], -np.inf)
        best = fwd[at, ends.argmax(1)]
        score = start + end[best]
        order = np.argsort(-score, kind="stable")
        ps, pe = ids[order], ids[best[order]]
        return Phrases(score[order], ps, pe, rows[order], *_offsets(meta, ps, pe), meta["in_title"][ps])

    def _phrases_of(self, qs: np.ndarray, qe: np.ndarray, start_hits: np.ndarray, end_hits: np.ndarray) -> Phrases:
        index, L = self.artifacts.index, self.max_len
        meta, n_vec = index.meta, index.manifest["vectors"]
        rows, title = meta["passage_row"], meta["in_title"]

        def tokens(ids):   # stored unsigned: widened before any subtraction
            return meta["token"][ids].astype(np.int32)

        start_hits, end_hits = start_hits[start_hits >= 0], end_hits[end_hits >= 0]
        offsets = np.arange(L)
        # Vector ids run in (passage, token) order, so the L ids after a start hit hold every kept token
        # within L tokens of it in the same passage (and the L ids before an end hit likewise).
        fwd = np.minimum(start_hits[:, None] + offsets, n_vec - 1)
        gap = tokens(fwd) - tokens(start_hits)[:, None]
        fwd_ok = (rows[fwd] == rows[start_hits][:, None]) & (gap < L) & (gap >= 0) & (title[fwd] == title[start_hits][:, None])
        bwd = np.maximum(end_hits[:, None] - offsets, 0)
        gap = tokens(end_hits)[:, None] - tokens(bwd)
        bwd_ok = (rows[bwd] == rows[end_hits][:, None]) & (gap < L) & (gap >= 0) & (title[bwd] == title[end_hits][:, None])
        start_ids = np.unique(np.concatenate([start_hits, bwd.ravel()]))
        end_ids = np.unique(np.concatenate([end_hits, fwd.ravel()]))
        start_scores = index.scores("start", start_ids, qs)   # each needed vector scored once
        end_scores = index.scores("end", end_ids, qe)
        self._check_scores(start_scores, end_scores)
        s_of = lambda ids: start_scores[np.searchsorted(start_ids, ids)]  # noqa: E731
        e_of = lambda ids: end_scores[np.searchsorted(end_ids, ids)]  # noqa: E731

        pairs_s, pairs_e, scores = [], [], []
        if len(start_hits):
            ends = np.where(fwd_ok, e_of(fwd), -np.inf)
            j = ends.argmax(1)
            pairs_s.append(start_hits)
            pairs_e.append(fwd[np.arange(len(j)), j])
            scores.append(s_of(start_hits) + ends[np.arange(len(j)), j])
        if len(end_hits):
            starts = np.where(bwd_ok, s_of(bwd), -np.inf)
            i = starts.argmax(1)
            pairs_s.append(bwd[np.arange(len(i)), i])
            pairs_e.append(end_hits)
            scores.append(starts[np.arange(len(i)), i] + e_of(end_hits))
        if not scores:
            return Phrases.empty()
        ps, pe, sc = np.concatenate(pairs_s), np.concatenate(pairs_e), np.concatenate(scores)
        order = np.argsort(-sc, kind="stable")
        _, first = np.unique((ps * n_vec + pe)[order], return_index=True)   # duplicates: keep the best
        keep = order[np.sort(first)]
        ps, pe = ps[keep], pe[keep]
        return Phrases(sc[keep], ps, pe, rows[ps], *_offsets(meta, ps, pe), title[ps])

    def _check_scores(self, start: np.ndarray, end: np.ndarray) -> None:
        if np.isnan(start).any() or np.isnan(end).any():
            # A NaN ranks arbitrarily and would print as an answer's score: a corrupted index, refused.
            d = self.artifacts.index.dir
            raise InputError(f"{d}: NaN phrase scores, the index is corrupted: check it with `odqa verify {d}`, "
                             f"and rebuild it")

    # --- the phrases as a question reads them ----------------------------------------------------
    def phrase(self, span: tuple) -> Phrase:
        """The `Phrase` of one span (`Phrases.at`), its text read from its passage (or title)."""
        score, _, _, row, char_start, char_end, in_title = span
        passage = self.artifacts.passage(row)
        return Phrase(text=self.artifacts.source(in_title, passage)[char_start:char_end], score=score,
                      passage_id=passage["id"], char_start=char_start, char_end=char_end, in_title=in_title)

    def answerable(self, span: tuple, question: str) -> bool:
        _, _, _, row, char_start, char_end, in_title = span
        return can_answer(self.artifacts.source(in_title, self.artifacts.passage(row)), char_start, char_end, question)

    @stage("phrase search")
    def top_phrases(self, phrases: Phrases, k: int, question: str, answer: AnswerConfig) -> list[Phrase]:
        """A phrase search's result: the first k phrases, of those that can answer with the filter on."""
        kept = []
        for i in range(len(phrases)):
            if len(kept) == k:
                break
            span = phrases.at(i)
            if not answer.answer_filter or self.answerable(span, question):
                kept.append(self.phrase(span))
        return kept

    def shown(self, phrases: Phrases, hits: list[int], query: tuple[str, np.ndarray, np.ndarray],
              answer: AnswerConfig) -> list[tuple[Phrase, int]]:
        """(the phrase shown, its passage row) of the units whose best hits are phrases[hits]: each hit,
        or with `answer_filter` the best span of its passage that can answer (the hit when none can)."""
        spans = [phrases.at(i) for i in hits]
        redo = [n for n, span in enumerate(spans) if answer.answer_filter and not self.answerable(span, query[0])]
        for n, span in zip(redo, self.best_spans([spans[n][3] for n in redo], query[1], query[2], query[0])):
            spans[n] = span or spans[n]
        return [(self.phrase(span), span[3]) for span in spans]

    def best_spans(self, rows: list[int], qs: np.ndarray, qe: np.ndarray, question: str) -> list[tuple | None]:
        """For each passage row, its best span (`Phrases.at`'s form) that `can_answer` `question`, over
        every pair of its indexed tokens within the span limit and one segment, or None when none can.
        The rows' vectors are scored together: one lookup table a side for all of them."""
        if not rows:
            return []
        index, L, vec = self.artifacts.index, self.max_len, self.artifacts.passage_vec
        meta = index.meta
        ranges = [(int(vec[r]), int(vec[r + 1])) for r in rows]
        ids = id_ranges(*zip(*ranges))
        start, end = index.scores("start", ids, qs), index.scores("end", ids, qe)
        found, offset = [], 0
        for row, (a, b) in zip(rows, ranges):
            passage = self.artifacts.passage(row)
            s, e = start[offset:offset + b - a], end[offset:offset + b - a]
            offset += b - a
            tokens = meta["token"][a:b].astype(np.int32)
            gap = tokens[None, :] - tokens[:, None]
            title = meta["in_title"][a:b]
            ok = (gap >= 0) & (gap < L) & (title[None, :] == title[:, None])
            span = np.where(ok, s[:, None] + e[None, :], -np.inf)
            best = None
            for flat in np.argsort(-span, axis=None, kind="stable"):
                i, j = divmod(int(flat), b - a)
                if not np.isfinite(span[i, j]):
                    break
                cs, ce = int(meta["char_start"][a + i]), int(meta["char_end"][a + j])
                if can_answer(self.artifacts.source(bool(title[i]), passage), cs, ce, question):
                    best = (float(span[i, j]), a + i, a + j, row, cs, ce, bool(title[i]))
                    break
            found.append(best)
        return found

    def indexed_phrase(self, row: int, answer: str, question: str, qs: np.ndarray, qe: np.ndarray,
                       answer_filter: bool) -> Phrase | None:
        """`answer`'s first occurrence in passage `row`'s text (as whole words, any case) that the index
        holds as a phrase: a kept token starting where it starts, one ending where it ends, within the
        cap; and that `can_answer` when `answer_filter`. Scored from the index; None if none."""
        passage, index = self.artifacts.passage(row), self.artifacts.index
        text = passage["text"]
        if not may_hold(text, answer):   # most answers asked of a passage are not in it: no regex for those
            return None
        meta, a, b = index.meta, int(self.artifacts.passage_vec[row]), int(self.artifacts.passage_vec[row + 1])
        text_tokens = None   # read on the first match: most answers asked of a passage are not in it
        for m in occurrences(text, answer):
            if text_tokens is None:
                text_tokens = ~meta["in_title"][a:b].astype(bool)
            starts = np.nonzero((meta["char_start"][a:b] == m.start()) & text_tokens)[0]
            ends = np.nonzero((meta["char_end"][a:b] == m.end()) & text_tokens)[0]
            if not len(starts) or not len(ends):
                continue
            i, j = a + int(starts[0]), a + int(ends[-1])
            if not 0 <= int(meta["token"][j]) - int(meta["token"][i]) < self.max_len:
                continue
            if answer_filter and not can_answer(text, m.start(), m.end(), question):
                continue
            ids = np.array([i, j], dtype=np.int64)
            score = float(index.scores("start", ids[:1], qs)[0] + index.scores("end", ids[1:], qe)[0])
            return self.phrase((score, i, j, row, m.start(), m.end(), False))
        return None

    @stage("phrase search")
    def hits(self, phrases: Phrases, keys: np.ndarray, best: np.ndarray, scores: list[float], parts: list[dict],
             unit: str, query: tuple[str, np.ndarray, np.ndarray], answer: AnswerConfig) -> list[Hit]:
        """The passages (`keys`: rows) or documents (document rows) ranked, each with its score, the
        parts of its score, and the phrase it shows (`shown`) for its best hit phrases[best[i]]."""
        out = []
        shown = self.shown(phrases, best.tolist(), query, answer)
        for key, (phrase, row), score, part in zip(keys.tolist(), shown, scores, parts):
            if unit == "passage":
                p = self.artifacts.passage(key)
                out.append(Hit(Passage(id=p["id"], title=p["title"], text=p["text"], score=score, phrase=phrase),
                               key, part))
            else:
                out.append(Hit(Document(id=str(self.artifacts.table.ids[key]), score=score, phrase=phrase), row, part))
        return out


@stage("phrase search")
def group(phrases: Phrases, unit: str, table) -> tuple[np.ndarray, np.ndarray]:
    """Passage rows (document rows, by `table`) in order of their best phrase, and the index of that
    phrase: Eq. 3, a passage's score is its best phrase's."""
    if unit == "phrase":
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = phrases.row if unit == "passage" else table.doc_of_passage[phrases.row]
    _, best = np.unique(keys, return_index=True)   # phrases run best first: the first of a key is its max
    best = np.sort(best)
    return keys[best], best


def id_ranges(starts, ends) -> np.ndarray:
    """The vector ids starts[i] .. ends[i] - 1 of each i, in order (a passage's or a document's vectors)."""
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(starts, ends)] or [np.zeros(0, np.int64)])


def _offsets(meta: dict, ps: np.ndarray, pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The character start of each phrase's start vector and end of its end vector, widened from their
    stored unsigned type so that arithmetic on them cannot wrap."""
    return meta["char_start"][ps].astype(np.int32), meta["char_end"][pe].astype(np.int32)


def occurrences(text: str, answer: str):
    """`answer` in `text` as whole words, any case: its re.Match objects in order."""
    return re.finditer(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", text, re.IGNORECASE)


def may_hold(text: str, answer: str) -> bool:
    """False only where `answer` has no `occurrences` in `text`: over ASCII alone, `re.IGNORECASE`'s
    match is the lower-cased substring's, found 10x faster than by the regex. Elsewhere only the
    regex tells (it matches "i" to "İ" and "ı", "s" to "ſ", which `str.lower` keeps apart)."""
    return not (answer.isascii() and text.isascii()) or answer.lower() in text.lower()


def can_answer(text: str, start: int, end: int, question: str) -> bool:
    """Whether the span text[start:end] of a passage can answer `question`: it is whole words (a word
    piece such as "ur" of "urinary" cannot; nor any span of a script written without spaces, for which
    the filter then keeps the search's own phrase), it does not cut through brackets or quotes
    ("lithium (Li" cannot), and neither its first nor its last word is a word of the question ("Yamuna
    river" for "... on the banks of which river"; an echo, "the Sava" for "... the River Sava and which
    other river?", is one such span)."""
    span = text[start:end]
    cut = (start > 0 and text[start - 1].isalnum() and text[start].isalnum()) or \
        (end < len(text) and text[end - 1].isalnum() and text[end].isalnum())
    balanced = span.count("(") == span.count(")") and span.count("[") == span.count("]") and span.count('"') % 2 == 0
    return not cut and balanced and not echoes_at_edge(span, question)
