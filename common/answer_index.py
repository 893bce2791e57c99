"""Which passages of a corpus contain an answer, by DPR's has_answer, for thousands of questions.

Scanning every passage per question is |Q| x |P| tokenisations; instead each passage is tokenised
once and an inverted index over DPR tokens gives the few passages holding all of an answer's tokens,
which are then checked for the contiguous sequence.

The index holds each passage's tokens as int32 ids into one vocabulary, and each token's passages
(CSR): 530 bytes a passage on the data pack's corpus, plus the vocabulary, and a peak of 3.5 KB a
passage against 22 KB for a token list and dictionary a passage (scripts/bench_answer_index.py). At
DPR's 21M passages that is about 11 GB of arrays, where the lists would take hundreds. The texts are
not kept.

`AnswerIndex.open(corpus_dir)` builds it once per corpus and saves it in CORPUS/answer-index; every
command after that memory-maps it (the vocabulary as sorted 64-bit word hashes, not a dict).

A regex answer (CuratedTREC) is checked with `re` on each passage's NFD text, as DPR does, but only
on the passages that can match: every match of most patterns holds a known run of letters and
digits ("Kennedy" in `Jack(ie)? Kennedy`, one of "After" or "Finishing" in `After the Fall|Finishing
the Play`), and a run of letters and digits lies inside one DPR token, so the passages holding a
vocabulary word that contains it are the candidates. The vocabulary is saved with the index for this.
A pattern with no such run (`\b4\b` is one: a digit alone is in too many words), or whose candidates
are a large part of the corpus, is searched in the passages joined by newlines a block at a time,
each passage a match touches then checked on its own: a match that crosses a join and hides one in
the next passage touches that passage too, and MULTILINE makes ^ and $ behave at the joins as at a
passage's ends. Scanning the whole corpus joined, as before, was about 27 hours for CuratedTREC's
patterns at 21M passages, in one string of the corpus's size.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import re._constants as sre  # the opcodes of the parser below; read only
import re._parser  # the parser `re` compiles with: which literals every match must hold
import unicodedata
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Collection, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from odqa.common.artifact import build_dir, current_manifest
from odqa.common.corpus import PassageStore, corpus_info
from odqa.common.io import InputError, loading
from odqa.common.metrics.answers import compile_answer_regex
from odqa.common.metrics.has_answer import answer_words, dpr_tokenize
from odqa.common.ranks import current

log = logging.getLogger(__name__)


def _word_hashes(words) -> np.ndarray:
    """blake2b's 64 bits of each word: the same in every process (Python's hash is salted), and with
    millions of words, a collision between two of them one chance in about 10^6 of 2^64."""
    return np.array([int.from_bytes(hashlib.blake2b(w.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
                     for w in words], dtype=np.uint64)


_PIECE = re.compile(r"[A-Za-z0-9]+")
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT)

# What every match of a pattern holds: a run of ASCII letters and digits (str), all of several
# ("all", [...]), or one of several ("any", [...]).
Need = "str | tuple[str, list[Need]]"


def requirement(pattern: str) -> Need | None:
    """The runs of ASCII letters and digits that every match of `pattern` holds, case aside, as an
    all/any tree; None when nothing is known. A run of letters and digits lies inside one DPR token.
    ASCII only: their case-insensitive matches are few and known (`_folded`)."""
    try:
        return _need(re._parser.parse(pattern, re.IGNORECASE | re.UNICODE | re.MULTILINE))
    except (re.error, RecursionError, TypeError, ValueError):
        return None


def _need(items) -> Need | None:
    needs, run = [], []

    def end_run() -> None:
        needs.extend(_PIECE.findall("".join(run)))
        run.clear()

    for op, av in items:
        if op is sre.LITERAL:
            run.append(chr(av))
            continue
        end_run()   # anything else may put characters between two literals
        if op is sre.SUBPATTERN:
            needs.append(_need(av[-1]))
        elif op is sre.ATOMIC_GROUP:
            needs.append(_need(av))
        elif op is sre.BRANCH:
            options = [_need(branch) for branch in av[1]]
            needs.append(("any", options) if all(o is not None for o in options) else None)
        elif op in _REPEATS and av[0] >= 1:
            needs.append(_need(av[2]))
    end_run()
    needs = [n for n in needs if n is not None]
    return None if not needs else needs[0] if len(needs) == 1 else ("all", needs)


@lru_cache(maxsize=None)
def _folded(char: str) -> str:
    """The lower-cased characters that `re` matches to the ASCII `char` case-insensitively, as a
    pattern: "(?:s|ſ)" for s (the long s), "k" for k (the Kelvin sign lower-cases to k)."""
    lowered = sorted({m.lower() for m in re.findall(re.escape(char), _every_character(), re.IGNORECASE | re.UNICODE)})
    return re.escape(lowered[0]) if len(lowered) == 1 else "(?:" + "|".join(map(re.escape, lowered)) + ")"


@lru_cache(maxsize=1)
def _every_character() -> str:
    return "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)


class CorpusTexts:
    """A built corpus's passage texts in row order, read from passages.jsonl each time it is iterated,
    or one by row."""

    def __init__(self, corpus_dir: str | os.PathLike):
        self.dir = corpus_dir
        self._n = corpus_info(corpus_dir)["passages"]

    def __len__(self) -> int:
        return self._n

    @cached_property
    def _store(self) -> PassageStore:
        return PassageStore(self.dir)

    def __getitem__(self, row: int) -> str:
        return self._store[row]["text"]

    def __iter__(self) -> Iterator[str]:
        store = PassageStore(self.dir)
        try:
            for p in store:
                yield p["text"]
        finally:
            store.close()


class AnswerIndex:
    def __init__(self, texts: Collection[str], chunk_tokens: int = 100_000):
        """`texts`: a collection, read once here and once more at the first regex answer (a list, or
        `CorpusTexts(corpus_dir)` for a corpus on disk), not a one-pass iterator."""
        if iter(texts) is texts:
            raise TypeError("AnswerIndex reads its texts twice: give it a collection (a list, or "
                            "CorpusTexts(corpus_dir)), not an iterator")
        self._texts = texts
        self._vocab: dict[str, int] = {}
        tokens, lengths, pairs = [], [], []
        ids: list[int] = []
        first_row = 0
        for row, text in enumerate(tqdm(texts, total=len(texts), desc="answer index", unit=" passages",
                                        mininterval=2, disable=None)):
            words = [self._vocab.setdefault(w, len(self._vocab)) for w, _, _ in dpr_tokenize(text)]
            ids.extend(words)
            lengths.append(len(words))
            if len(ids) >= chunk_tokens:
                tokens.append(self._flush(ids, lengths[first_row:], first_row, pairs))
                ids, first_row = [], row + 1
        tokens.append(self._flush(ids, lengths[first_row:], first_row, pairs))
        self._tokens = np.concatenate(tokens)
        self._bounds = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        # Each token's passages, ascending: the (passage, token) pairs come in passage order, and a
        # stable sort by token keeps that order within a token.
        pair_rows = np.concatenate([p[0] for p in pairs])
        pair_words = np.concatenate([p[1] for p in pairs])
        order = np.argsort(pair_words, kind="stable")
        self._post_rows = pair_rows[order]
        self._post_bounds = np.concatenate([[0], np.cumsum(np.bincount(pair_words, minlength=len(self._vocab)))])
        # the vocabulary as sorted 64-bit hashes of its words beside their ids: 12 bytes a word, saved
        # and memory-mapped as the rest are, where a dict of millions of strings is rebuilt per process
        hashes = _word_hashes(self._vocab)
        order = np.argsort(hashes)
        self._hashes, self._hash_ids = hashes[order], np.fromiter(self._vocab.values(), np.int32, len(self._vocab))[order]
        # the words themselves, by id, for regex answers: one newline-joined UTF-8 text (a token never
        # holds white space) and where each word starts in its characters
        self._words = np.frombuffer("\n".join(self._vocab).encode("utf-8", "surrogatepass"), dtype=np.uint8)
        self._word_starts = np.concatenate([[0], np.cumsum([len(w) + 1 for w in self._vocab], dtype=np.int64)])
        del self._vocab

    ARRAYS = ("tokens", "bounds", "post_rows", "post_bounds", "hashes", "hash_ids", "words", "word_starts")
    SCAN_BLOCK = 4096      # passages joined at a time for a pattern with no required run
    SCAN_ABOVE = 1 / 2     # candidates beyond this share of the corpus are scanned: 22 µs a passage read
                           # by row, 16 µs a passage in the scan (scripts/bench_regex_answers.py)

    @classmethod
    def open(cls, corpus_dir: str | os.PathLike) -> "AnswerIndex":
        """The answer index of a built corpus, saved in CORPUS/answer-index and memory-mapped, so every
        command (and every process of a node) shares one copy; built and saved at its first use, by
        rank 0 alone under a launcher."""
        out = Path(corpus_dir) / "answer-index"
        key = {"corpus": corpus_info(corpus_dir)["fingerprint"], "format": 2}
        ranks = current()
        if ranks.main and not current_manifest(out, key):
            built = cls(CorpusTexts(corpus_dir))
            try:
                with build_dir(out, key, passages=len(built)) as (tmp, _):
                    for name in cls.ARRAYS:
                        np.save(tmp / f"{name}.npy", getattr(built, f"_{name}"))
            except PermissionError:   # a corpus others own, read-only: the index lives in this process only
                if ranks.world > 1:
                    raise InputError(f"{out}: cannot write the answer index the ranks share") from None
                log.warning("%s is read-only: the answer index is not saved", corpus_dir)
                return built
        ranks.barrier()
        index = cls.__new__(cls)
        index._texts = CorpusTexts(corpus_dir)
        for name in cls.ARRAYS:
            with loading(out / f"{name}.npy", "the corpus's answer index"):
                setattr(index, f"_{name}", np.load(out / f"{name}.npy", mmap_mode="r", allow_pickle=False))
        if len(index) != len(index._texts):
            raise InputError(f"{out}: an answer index of {len(index)} passages for a corpus of {len(index._texts)}")
        return index

    @staticmethod
    def _flush(ids: list[int], lengths: list[int], first_row: int, pairs: list) -> np.ndarray:
        """The chunk's tokens as int32, and its distinct (passage, token) pairs appended to `pairs`."""
        chunk = np.asarray(ids, dtype=np.int32)
        rows = np.repeat(np.arange(first_row, first_row + len(lengths), dtype=np.int64), lengths)
        distinct = np.unique((rows << 32) | chunk.astype(np.int64))   # sorted by passage, then token
        pairs.append(((distinct >> 32).astype(np.int32), (distinct & 0xFFFFFFFF).astype(np.int32)))
        return chunk

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def _word_id(self, word: str) -> int | None:
        h = _word_hashes([word])[0]
        at = int(np.searchsorted(self._hashes, h))
        return int(self._hash_ids[at]) if at < len(self._hashes) and self._hashes[at] == h else None

    def _rows_of(self, word: int) -> np.ndarray:
        return self._post_rows[self._post_bounds[word]:self._post_bounds[word + 1]]

    def _occurs(self, row: int, answer: np.ndarray) -> bool:
        """Whether the token ids `answer` occur contiguously in passage `row`."""
        seq = self._tokens[self._bounds[row]:self._bounds[row + 1]]
        if len(seq) < len(answer):
            return False
        at = np.flatnonzero(seq[:len(seq) - len(answer) + 1] == answer[0])
        for j in range(1, len(answer)):
            at = at[seq[at + j] == answer[j]]
        return len(at) > 0

    def _rows_with_tokens(self, answer: str) -> list[int]:
        ans = [self._word_id(w) for w in answer_words(answer)]
        if not ans or None in ans:
            return []
        lists = sorted((self._rows_of(w) for w in set(ans)), key=len)
        rows = lists[0]
        for other in lists[1:]:
            if not len(rows):
                break
            rows = np.intersect1d(rows, other, assume_unique=True)
        if len(ans) == 1:   # a one-token answer occurs wherever its token does
            return rows.tolist()
        answer_ids = np.asarray(ans, dtype=np.int32)
        return [row for row in rows.tolist() if self._occurs(row, answer_ids)]

    @cached_property
    def _vocabulary(self) -> str:
        return self._words.tobytes().decode("utf-8", "surrogatepass")

    def _words_holding(self, piece: str) -> np.ndarray:
        """Ids of the vocabulary's words that hold `piece`, case aside: a case-sensitive scan of the
        lower-cased words, ten times faster than IGNORECASE's."""
        if piece not in self._holding:
            found = re.compile("".join(_folded(c) for c in piece.lower()))
            starts = np.fromiter((m.start() for m in found.finditer(self._vocabulary)), np.int64)
            self._holding[piece] = np.unique(np.searchsorted(self._word_starts, starts, side="right") - 1)
        return self._holding[piece]

    @cached_property
    def _holding(self) -> dict[str, np.ndarray]:
        return {}   # a piece's words: CuratedTREC's patterns share many ("feet", "million")

    def _postings(self, words: np.ndarray) -> np.ndarray:
        """The passages of any of `words`, ascending."""
        first, last = self._post_bounds[words], self._post_bounds[words + 1]
        sizes = last - first
        at = np.repeat(first - np.cumsum(sizes) + sizes, sizes) + np.arange(sizes.sum())
        return np.unique(self._post_rows[at])

    def _candidates(self, need: Need) -> tuple[np.ndarray, int]:
        """(words, their postings): words whose passages include every passage that holds `need`; of an
        "all", its part with the fewest postings, as the regex checks each candidate anyway."""
        if isinstance(need, str):
            words = self._words_holding(need)
            return words, int((self._post_bounds[words + 1] - self._post_bounds[words]).sum())
        parts = [self._candidates(n) for n in need[1]]
        if need[0] == "all":
            return min(parts, key=lambda part: part[1])
        return np.unique(np.concatenate([words for words, _ in parts])), sum(n for _, n in parts)

    def _scan(self, exact: re.Pattern) -> set[int]:
        """Every passage searched, SCAN_BLOCK joined by newlines at a time."""
        rows: set[int] = set()
        block: list[str] = []
        row = -1   # no text at all: nothing to search
        for row, text in enumerate(tqdm(self._texts, total=len(self), desc="answer index (regex scan)",
                                        unit=" passages", mininterval=2, disable=None)):
            block.append(unicodedata.normalize("NFD", text))
            if len(block) == self.SCAN_BLOCK or row == len(self) - 1:
                rows.update(row + 1 - len(block) + r for r in self._matching_in(exact, block))
                block = []
        if row != len(self) - 1:
            raise ValueError(f"AnswerIndex: its texts held {len(self)} passages, and now {row + 1}")
        return rows

    @staticmethod
    def _matching_in(exact: re.Pattern, nfd: list[str]) -> set[int]:
        starts = np.cumsum([0] + [len(t) + 1 for t in nfd])
        joined = "\n".join(nfd)
        touched: set[int] = set()
        for m in exact.finditer(joined):
            first = int(np.searchsorted(starts, m.start(), side="right")) - 1
            last = int(np.searchsorted(starts, max(m.end() - 1, m.start()), side="right")) - 1
            touched.update(range(first, last + 1))
        return {r for r in touched if exact.search(nfd[r])}

    def _rows_matching(self, pattern: str) -> set[int]:
        try:
            # `re`, as the per-passage check: the `regex` module scans twice as fast but draws word
            # boundaries elsewhere (it counts U+200D, the zero-width joiner, as a word character), so
            # it missed passages that `re` matches ("509\u200d-\u200d27 BC" for \b2[78]\b)
            exact = compile_answer_regex(pattern)
        except ValueError:
            return set()
        need = requirement(pattern)
        if need is None:
            return self._scan(exact)
        words, _ = self._candidates(need)
        rows = self._postings(words)
        if len(rows) > self.SCAN_ABOVE * len(self):
            return self._scan(exact)
        return {int(r) for r in rows if exact.search(unicodedata.normalize("NFD", self._texts[int(r)]))}

    def find(self, answers: Sequence[str], regex: bool = False) -> list[int]:
        """Rows of the passages whose text contains any answer, ascending."""
        rows: set[int] = set()
        if regex:
            for pattern in answers:
                rows.update(self._rows_matching(pattern))
        else:
            for answer in answers:
                rows.update(self._rows_with_tokens(answer))
        return sorted(rows)
