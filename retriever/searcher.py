"""One `Searcher` over a phrase index: phrases, passages and documents from the same vectors.

Phrase search (DensePhrases): top-k' MIPS over start vectors and over end vectors; for each start hit
the best end within L tokens of the same passage, for each end hit the best start (L: the index's, or a
shorter `max_answer_tokens` at search time); score = start + end,
both read back from the index (decoded from the codes for SQ/PQ); duplicates merged. A passage's score is the max of
its phrases' scores ("Phrase Retrieval Learns Passage Retrieval, Too", Eq. 3), a document's the max of
its passages'. k' starts at 2k and doubles until k distinct passages (documents) come back.

With a document pre-filter (DHR), a `DocRetriever` picks each question's top `top_docs` documents
first and the phrase search runs only over their vectors. A document's vectors are one contiguous id
range (vectors run in passage order and a document's passages are consecutive), so every vector of
the top documents is scored from the index (for IVF-PQ, from its codes through one lookup table a
side) and every phrase in them is paired: exact Eq. 3 within the documents, in one pass, at a cost
that grows with the documents read, not with the index. Passages are then reranked by
z(passage score) + lambda * z(document score) (`retriever.rerank`) over the top `rerank_pool` by
passage score; with lambda = 0 there is nothing to rerank and the pool is k. With a BM25 weight mu the
rerank adds mu * z(BM25 score of the passage) (for a document, of its best passage), scored by the
corpus's BM25 index over the same pool.

The phrase a passage (document) shows, its extractive answer, is its best span that `can_answer`: whole
words, with no word of the question at either edge. The encoders score spans that repeat the question
high ("the Sava" for "... the River Sava and which other river?", "Yamuna river" for "... on the banks
of which river"); when a passage's best hit is one, every span of the passage within the cap is scored
from the index and the best that can answer is shown instead.
Passage scores and their order do not change.

With an answer memory (`retriever.answer_memory`), the question's nearest training questions (by the
same question vectors) whose cosine passes `memory_threshold` lend their answers to the extractive
answer's vote: each adds `memory_weight` x its cosine to an answer that is an indexed phrase of one of
the top `answer_depth` passages (of a document, of the passage its phrase is in), within the cap, that
can answer. Each result then lists the neighbours it consulted ("memory").

With a phrase model trained with title phrases, a passage's title tokens are indexed beside its text
tokens: a phrase lies in the title or in the text, never across the two, and a title phrase's text is
read from the title.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from odqa.common.corpus import DocumentTable, PassageStore, corpus_info
from odqa.common.device import pick_device, search_dtype
from odqa.common.io import InputError
from odqa.common.metrics.answers import echoes_at_edge, normalize_answer
from odqa.retriever.answer_aggregation import aggregate_answer
from odqa.retriever.answer_memory import AnswerMemory, Neighbour, question_vectors
from odqa.retriever.args import SearchConfig
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_data import passage_title
from odqa.retriever.phrase_index import PhraseIndex
from odqa.retriever.phrase_model import (
    DensePhraseModel,
    phrase_encoder_hash,
    question_encoder_hash,
    question_vectors_of,
)
from odqa.retriever.rerank import Candidates, combined, doc_z_of, rerank_order, standardise

log = logging.getLogger(__name__)
UNITS = ("phrase", "passage", "document")


@dataclass
class Phrase:
    score: float
    start_vec: int
    end_vec: int
    row: int          # passage row in passages.jsonl
    char_start: int   # in the passage's text, or in its title when in_title
    char_end: int
    in_title: bool = False


class Phrases(Sequence):
    """One question's phrases, best first, held as arrays; a `Phrase` is made only when one is read."""

    def __init__(self, score, start_vec, end_vec, row, char_start, char_end, in_title):
        self.score, self.start_vec, self.end_vec = score, start_vec, end_vec
        self.row, self.char_start, self.char_end, self.in_title = row, char_start, char_end, in_title

    def __len__(self) -> int:
        return len(self.score)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Phrases(*(a[i] for a in self._arrays()))
        return Phrase(float(self.score[i]), *(int(a[i]) for a in self._arrays()[1:-1]), bool(self.in_title[i]))

    def take(self, which) -> list[Phrase]:
        """The phrases at these positions (a slice or indices), made in one pass over the arrays."""
        return [Phrase(*x) for x in zip(*(a[which].tolist() for a in self._arrays()))]

    def _arrays(self) -> tuple:
        return self.score, self.start_vec, self.end_vec, self.row, self.char_start, self.char_end, self.in_title


class Searcher:
    def __init__(self, index_dir: str | os.PathLike, model_dir: str | os.PathLike, corpus_dir: str | os.PathLike,
                 config: SearchConfig | None = None, *, device: str | None = None, batch_size: int = 64,
                 prefilter=None, rerank_pool: int = 100, dtype=None, reranker=None, memory: AnswerMemory | None = None,
                 **settings):
        """`config`: the search settings (`SearchConfig`'s defaults where None), with `settings` (its fields
        by name) in their place. `prefilter`: a `retriever.doc_index.DocRetriever` over the same corpus;
        the rerank's weights of the document score and of the passage's BM25 score (`lam`,
        `bm25_weight`) default to the values `odqa tune-lambda` stored with its index, else 0.
        `max_answer_tokens` is capped at the index's L (no longer phrase is indexed). `answer_filter`: a
        passage's (document's) phrase is its best span that `can_answer` the question (whole words, no
        question word at its edges), found over all its indexed tokens, not only among the phrases
        search hit; phrase results skip the others. `dtype`: the model's (default `search_dtype`:
        bfloat16 where the hardware has it; a model that will be trained needs float32). `reranker`: a
        `retriever.cross_encoder.CrossEncoder` that reorders each question's top max(k, `rerank_depth`)
        passages by z(search score) + its weight x z(its score) (passages only). `answer_depth`,
        `answer_temperature`: the extractive answer's vote (`aggregate_answer`); depth 1 makes it the
        first unit's phrase. `memory`: an `AnswerMemory` built with this model's question encoders,
        whose `memory_neighbours` nearest questions at cosine >= `memory_threshold` each add
        `memory_weight` x cosine to their answers' votes."""
        config = dataclasses.replace(config or SearchConfig(), **settings)
        self.memory = memory
        self.index = PhraseIndex(index_dir, config.nprobe)
        self.device = pick_device(device)
        # loaded (and its files checked against its checksums) before its hashes are compared: a damaged
        # file is named as such, not taken for another model
        self.model = DensePhraseModel.from_pretrained(model_dir).to(self.device, dtype or search_dtype(self.device)).eval()
        if phrase_encoder_hash(model_dir) != self.index.manifest["encoder_hash"]:
            raise InputError(f"{index_dir} was built with another phrase encoder than {model_dir}: search with the "
                             f"model it was built from, or rebuild it from this one (`odqa dump-phrases`, then "
                             f"`odqa build-index`; a demo run does so in its index stage)")
        if corpus_info(corpus_dir)["fingerprint"] != self.index.manifest["fingerprint"]:
            raise InputError(f"{index_dir} was built from another version of the corpus {corpus_dir}")
        self.tokenizer = load_tokenizer(model_dir)
        if memory is not None and memory.question_encoder != question_encoder_hash(model_dir):
            raise InputError(f"{memory.dir} was built with other question encoders than {model_dir}'s, so their "
                             f"vectors would not compare: rebuild it with `odqa build-memory --model {model_dir}`")
        self.store = PassageStore(corpus_dir)
        # Popular passages come back for many questions: each is read (and parsed) once while it stays popular.
        self._passage = lru_cache(maxsize=65_536)(self.store.__getitem__)
        self.batch_size = batch_size
        # Passage row r's vectors are ids passage_vec[r] .. passage_vec[r + 1] - 1.
        self.passage_vec = np.concatenate([[0], np.cumsum(self.index.meta["passage_count"])]).astype(np.int64)
        self.corpus_dir, self._table = corpus_dir, None
        self.prefilter, self.rerank_pool = prefilter, rerank_pool
        self.reranker = reranker
        if reranker is not None:
            reranker.to(self.device).eval()
        if prefilter is not None:
            if prefilter.manifest["fingerprint"] != self.index.manifest["fingerprint"]:
                raise InputError(f"{prefilter.dir} and {index_dir} were built from different corpora")
            # Document d's vectors are ids doc_vec_start[d] .. doc_vec_end[d] - 1.
            table = prefilter.table
            self.doc_vec_start = self.passage_vec[table.first]
            self.doc_vec_end = self.passage_vec[table.first + table.count]
        self.bm25 = None
        self.config = self._resolved(config)

    def _resolved(self, config: SearchConfig) -> SearchConfig:
        """`config` as this searcher runs it: the rerank's weights tuned where not given, the answer cap
        at most the index's L; BM25 opened when its weight is first set."""
        L = self.index.max_span_len
        tuned = (0.0, 0.0) if self.prefilter is None else (self.prefilter.tuned_lambda or 0.0,
                                                           self.prefilter.tuned_bm25_weight or 0.0)
        lam = config.lam if config.lam is not None else tuned[0]
        bm25_weight = config.bm25_weight if config.bm25_weight is not None else tuned[1]
        if self.prefilter is None and (config.lam or config.bm25_weight):
            raise InputError("a rerank weight (lam, bm25_weight) weighs the document pre-filter's scores: this "
                             "search has no pre-filter")
        if bm25_weight and self.bm25 is None:
            from odqa.retriever.bm25 import BM25Index
            self.bm25 = BM25Index.open(self.corpus_dir, mmap=True)   # the rerank reads its candidates' scores only
        return dataclasses.replace(config, lam=lam, bm25_weight=bm25_weight,
                                   max_answer_tokens=min(config.max_answer_tokens or L, L))

    def with_settings(self, **settings) -> "Searcher":
        """This searcher with other settings (`SearchConfig`'s fields but nprobe, which the index is opened
        with): the same index, model and corpus, shared, not loaded again, and this one left as it is
        (the server searches for other requests meanwhile)."""
        if "nprobe" in settings and settings["nprobe"] != self.config.nprobe:
            raise InputError("nprobe is set when the index opens: open another searcher (odqa.load(nprobe=...))")
        other = copy.copy(self)
        other.config = other._resolved(dataclasses.replace(self.config, **settings))
        return other

    def encode(self, questions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return question_vectors_of(self.model, self.tokenizer, questions, self.batch_size, self.device)

    def search_phrases(self, q_start: np.ndarray, q_end: np.ndarray, k: int) -> list[Phrases]:
        """Top phrases per question, best first, from k start hits and k end hits of one batched MIPS."""
        ix = self.index
        k = min(k, ix.manifest["vectors"])
        q_start = np.ascontiguousarray(q_start, dtype=np.float32)
        q_end = np.ascontiguousarray(q_end, dtype=np.float32)
        _, start_hits = ix.search("start", q_start, k)
        _, end_hits = ix.search("end", q_end, k)
        return [self._phrases_of(q_start[i], q_end[i], start_hits[i], end_hits[i]) for i in range(len(q_start))]

    def phrases_in_documents(self, q_start: np.ndarray, q_end: np.ndarray, doc_rows: np.ndarray) -> list[Phrases]:
        """The phrases of each question's documents (`doc_rows`, a row of document rows a question, -1
        for none), best first: every token of theirs paired with its best end, so every passage in them
        gets its best phrase, exactly (the pre-filter's search)."""
        out = []
        for qs, qe, rows in zip(q_start, q_end, doc_rows):
            rows = rows[rows >= 0]
            out.append(self._every_phrase(qs, qe, _id_ranges(self.doc_vec_start[rows], self.doc_vec_end[rows])))
        return out

    def _every_phrase(self, qs: np.ndarray, qe: np.ndarray, ids: np.ndarray) -> Phrases:
        """Each of `ids` (whole passages, each in id order) as a start, with its best end within the
        span limit: the best phrase starting there. A passage's best phrase is the best of its own."""
        meta, L = self.index.meta, self.config.max_answer_tokens
        start, end = self.index.scores("start", ids, qs), self.index.scores("end", ids, qe)
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
        meta, L, n_vec = self.index.meta, self.config.max_answer_tokens, self.index.manifest["vectors"]
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
        start_scores = self.index.scores("start", start_ids, qs)   # each needed vector scored once
        end_scores = self.index.scores("end", end_ids, qe)
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
            empty = np.zeros(0, np.int64)
            return Phrases(np.zeros(0, np.float32), *(empty,) * 5, np.zeros(0, bool))
        ps, pe, sc = np.concatenate(pairs_s), np.concatenate(pairs_e), np.concatenate(scores)
        order = np.argsort(-sc, kind="stable")
        _, first = np.unique((ps * n_vec + pe)[order], return_index=True)   # duplicates: keep the best
        keep = order[np.sort(first)]
        ps, pe = ps[keep], pe[keep]
        return Phrases(sc[keep], ps, pe, rows[ps], *_offsets(meta, ps, pe), title[ps])

    def _check_scores(self, start: np.ndarray, end: np.ndarray) -> None:
        if np.isnan(start).any() or np.isnan(end).any():
            # A NaN ranks arbitrarily and would print as an answer's score: a corrupted index, refused.
            raise InputError(f"{self.index.dir}: NaN phrase scores, the index is corrupted: check it with "
                             f"`odqa verify {self.index.dir}`, and rebuild it")

    @property
    def table(self) -> DocumentTable:
        """The corpus's documents and their passage rows (the pre-filter's, when there is one)."""
        if self._table is None:
            self._table = self.prefilter.table if self.prefilter is not None else DocumentTable(self.corpus_dir)
        return self._table

    def rows_of_doc(self, doc_id: str) -> range:
        d = self.table.row_of.get(doc_id)
        return range(0) if d is None else self.table.passage_rows(d)

    def search(self, questions: list[str], k: int = 10, unit: str = "passage",
               max_phrases: int | None = None) -> list[dict]:
        """For each question: its top phrases, and for unit passage/document the top k of those with the
        extractive "answer" their top `answer_depth` vote for. k' doubles from 2k up to `max_phrases`
        (default 64k) hits a side; a question whose phrases sit in fewer than k passages even then gets
        fewer, which bounds the cost of very peaked questions."""
        if unit not in UNITS:
            raise InputError(f"unit must be one of {UNITS}, not {unit!r}")
        if k < 1:
            raise InputError(f"k must be positive, not {k}")
        q_start, q_end = self.encode(questions)
        if unit == "phrase":
            return self._search(questions, q_start, q_end, k, unit, max_phrases)
        # The answer must not depend on how many passages the caller reads: search as deep as it votes.
        n = max(k, self.config.answer_depth)
        if self.reranker is not None and unit == "passage":
            results = self._search(questions, q_start, q_end, max(n, self.config.rerank_depth), unit, max_phrases)
            results = [self._cross_rerank(q, r, n) for q, r in zip(questions, results)]
        else:
            results = self._search(questions, q_start, q_end, n, unit, max_phrases)
        key = unit + "s"
        neighbours = ([[] for _ in questions] if self.memory is None else
                      self.memory.neighbours(question_vectors(q_start, q_end), self.config.memory_neighbours,
                                             self.config.memory_threshold))
        for i, r in enumerate(results):
            prior = self._memory_votes(questions[i], q_start[i], q_end[i], r[key][:self.config.answer_depth], neighbours[i])
            r["answer"] = aggregate_answer(r[key], self.config.answer_depth, self.config.answer_temperature, prior)
            if self.memory is not None:   # the vote without the memory too: the phrase model's own answer
                r["answer_without_memory"] = aggregate_answer(r[key], self.config.answer_depth,
                                                              self.config.answer_temperature, [])
            r[key] = r[key][:k]
            if self.memory is not None:
                r["memory"] = [{"question": nb.question, "answers": nb.answers, "similarity": nb.similarity}
                               for nb in neighbours[i]]
        return results

    def _memory_votes(self, question: str, qs: np.ndarray, qe: np.ndarray, units: list[dict],
                      neighbours: list[Neighbour]) -> list[tuple[dict, float]]:
        """The memory's votes: each neighbour votes once for each of its distinct answer strings (as exact
        match compares them) with weight `memory_weight` x cosine, for the answer as an indexed phrase of
        the highest-ranked unit that holds it; an answer that no unit holds as a phrase gets no vote."""
        votes, found = [], {}
        for nb in neighbours:
            seen = set()
            for answer in nb.answers:
                key = normalize_answer(answer)
                if not key or key in seen:
                    continue
                if key not in found:
                    found[key] = next((p for u in units if u.get("phrase") and
                                       (p := self._indexed_phrase(u["phrase"]["row"], answer, question, qs, qe))), None)
                if found[key] is not None:
                    seen.add(key)
                    votes.append((found[key], self.config.memory_weight * nb.similarity))
        return votes

    def _indexed_phrase(self, row: int, answer: str, question: str, qs: np.ndarray, qe: np.ndarray) -> dict | None:
        """`answer`'s first occurrence in passage `row`'s text (as whole words, any case) that the index
        holds as a phrase: a kept token starting where it starts, one ending where it ends, within the
        cap; and that `can_answer` when the answer filter is on. Scored from the index; None if none."""
        passage = self._passage(row)
        meta, a, b = self.index.meta, int(self.passage_vec[row]), int(self.passage_vec[row + 1])
        text_tokens = ~meta["in_title"][a:b].astype(bool)
        for m in re.finditer(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", passage["text"], re.IGNORECASE):
            starts = np.nonzero((meta["char_start"][a:b] == m.start()) & text_tokens)[0]
            ends = np.nonzero((meta["char_end"][a:b] == m.end()) & text_tokens)[0]
            if not len(starts) or not len(ends):
                continue
            i, j = a + int(starts[0]), a + int(ends[-1])
            if not 0 <= int(meta["token"][j]) - int(meta["token"][i]) < self.config.max_answer_tokens:
                continue
            if self.config.answer_filter and not can_answer(passage["text"], m.start(), m.end(), question):
                continue
            ids = np.array([i, j], dtype=np.int64)
            score = float(self.index.scores("start", ids[:1], qs)[0] + self.index.scores("end", ids[1:], qe)[0])
            return self._phrase_json(Phrase(score, i, j, row, m.start(), m.end()), passage)
        return None

    def _search(self, questions: list[str], q_start: np.ndarray, q_end: np.ndarray, k: int, unit: str,
                max_phrases: int | None) -> list[dict]:
        if self.prefilter is not None:
            pool = k if not self.reranks or unit == "phrase" else max(k, self.rerank_pool)
            doc_rows, doc_scores = self.prefilter.search(questions, self.config.top_docs)
            phrases = self.phrases_in_documents(q_start, q_end, doc_rows)
            return [self._result(ph, self._group(ph, unit), k, unit, pool, (doc_rows[i], doc_scores[i]),
                                 (questions[i], q_start[i], q_end[i])) for i, ph in enumerate(phrases)]
        results: list[dict | None] = [None] * len(questions)
        n_vec = self.index.manifest["vectors"]
        todo, kk = np.arange(len(questions)), 2 * k
        cap = min(max_phrases or 64 * k, n_vec)
        while len(todo):
            # One search per round; only questions short of k passages (documents) go again.
            phrases = self.search_phrases(q_start[todo], q_end[todo], kk)
            again = []
            for qi, ph in zip(todo, phrases):
                groups = self._group(ph, unit)
                if unit == "phrase" or len(groups[0]) >= k or kk >= cap:
                    results[qi] = self._result(ph, groups, k, unit, k, None, (questions[qi], q_start[qi], q_end[qi]))
                else:
                    again.append(qi)
            todo, kk = np.asarray(again, dtype=np.int64), kk * 2
        return results

    def _cross_rerank(self, question: str, result: dict, k: int) -> dict:
        """The result's passages reordered by z(search score) + w x z(cross-encoder score), its first k
        kept: each passage's `score` becomes that sum, beside its `search_score` and `cross_score`."""
        from odqa.retriever.cross_encoder import final_scores
        passages = result["passages"]
        if not passages:
            return result
        cross = self.reranker.score(question, passages)
        final = final_scores([p["score"] for p in passages], cross, self.reranker.weight)
        order = np.argsort(-final, kind="stable")[:k]
        result["passages"] = [{**passages[i], "score": float(final[i]), "search_score": passages[i]["score"],
                               "cross_score": float(cross[i])} for i in order]
        return result

    @property
    def reranks(self) -> bool:
        return bool(self.config.lam or self.config.bm25_weight)

    def _group(self, phrases: Phrases, unit: str) -> tuple[np.ndarray, np.ndarray]:
        """Passage rows (document rows) in order of their best phrase, and the index of that phrase: Eq. 3,
        a passage's score is its best phrase's."""
        if unit == "phrase":
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        keys = phrases.row if unit == "passage" else self.table.doc_of_passage[phrases.row]
        _, best = np.unique(keys, return_index=True)   # phrases run best first: the first of a key is its max
        best = np.sort(best)
        return keys[best], best

    def _phrase_json(self, p: Phrase, passage: dict) -> dict:
        return {"text": self.source(p, passage)[p.char_start:p.char_end], "in_title": p.in_title,
                "passage_id": passage["id"], "row": p.row,
                "char_start": p.char_start, "char_end": p.char_end, "score": p.score}

    def source(self, p: Phrase, passage: dict) -> str:
        """The string a phrase's offsets index: its passage's text, or its title as the phrase model read it."""
        return passage_title(passage, self.model.config.title_path) if p.in_title else passage["text"]

    def _best_spans(self, rows: list[int], passages: list[dict], qs: np.ndarray, qe: np.ndarray,
                    question: str) -> list[Phrase | None]:
        """For each passage row (whose passage is given), its best phrase that `can_answer` `question`,
        over every pair of its indexed tokens within the span limit and one segment, or None when none
        can. The rows' vectors are scored together: one lookup table a side for all of them."""
        if not rows:
            return []
        meta, L = self.index.meta, self.config.max_answer_tokens
        ranges = [(int(self.passage_vec[r]), int(self.passage_vec[r + 1])) for r in rows]
        ids = _id_ranges(*zip(*ranges))
        start, end = self.index.scores("start", ids, qs), self.index.scores("end", ids, qe)
        found, offset = [], 0
        for row, passage, (a, b) in zip(rows, passages, ranges):
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
                phrase = Phrase(float(span[i, j]), a + i, a + j, row, cs, ce, bool(title[i]))
                if can_answer(self.source(phrase, passage), cs, ce, question):
                    best = phrase
                    break
            found.append(best)
        return found

    def _result(self, phrases: Phrases, groups: tuple[np.ndarray, np.ndarray], k: int, unit: str, pool: int,
                doc_info: tuple[np.ndarray, np.ndarray] | None, query: tuple[str, np.ndarray, np.ndarray]) -> dict:
        passage = self._passage

        def shown(hits: list[int]) -> list[dict]:
            """The phrases shown by the units whose best hits are phrases[hits]: each hit, or with
            `answer_filter` the best span of its passage that can answer (the hit when none can)."""
            ps = phrases.take(np.asarray(hits, dtype=np.int64))
            redo = [n for n, p in enumerate(ps) if self.config.answer_filter
                    and not can_answer(self.source(p, passage(p.row)), p.char_start, p.char_end, query[0])]
            spans = self._best_spans([ps[n].row for n in redo], [passage(ps[n].row) for n in redo], query[1], query[2],
                                     query[0])
            for n, span in zip(redo, spans):
                ps[n] = span or ps[n]
            return [self._phrase_json(p, passage(p.row)) for p in ps]

        if unit == "phrase":
            kept = []
            for p in phrases:
                if len(kept) == k:
                    break
                if not self.config.answer_filter or can_answer(self.source(p, passage(p.row)), p.char_start, p.char_end,
                                                               query[0]):
                    kept.append(self._phrase_json(p, passage(p.row)))
            return {"phrases": kept}
        result = {"phrases": [self._phrase_json(p, passage(p.row)) for p in phrases.take(slice(k))]}
        keys, best = groups[0][:pool], groups[1][:pool]
        scores = phrases.score[best].astype(np.float64)
        extra = [{} for _ in keys]
        if doc_info is not None and len(keys):
            docs = self.table.doc_of_passage[keys] if unit == "passage" else keys
            c = Candidates(scores, doc_z_of(*doc_info, docs))
            if self.config.bm25_weight:
                c.bm25_z = standardise(self.bm25.scores_of(query[0], phrases.row[best]))
            if self.reranks:
                weights = (self.config.lam, self.config.bm25_weight)
                order, final = rerank_order(c, *weights), combined(c, *weights)
                keys, best, scores = keys[order], best[order], final[order]
                c = Candidates(c.passage_scores[order], c.doc_z[order],
                               bm25_z=None if c.bm25_z is None else c.bm25_z[order])
            extra = [{"passage_score": float(ps), "doc_z": float(dz)} for ps, dz in zip(c.passage_scores, c.doc_z)]
            if c.bm25_z is not None:
                for x, bz in zip(extra, c.bm25_z):
                    x["bm25_z"] = float(bz)
        keys, best, scores, extra = keys[:k], best[:k], scores[:k], extra[:k]
        if unit == "passage":
            result["passages"] = []
            for row, phrase, score, x in zip(keys.tolist(), shown(best.tolist()), scores.tolist(), extra):
                p = passage(row)
                result["passages"].append({"id": p["id"], "row": row, "title": p["title"], "text": p["text"],
                                           "score": score, **x, "phrase": phrase})
        else:
            result["documents"] = [{"id": str(self.table.ids[d]), "score": score, **x, "phrase": phrase}
                                   for d, phrase, score, x in zip(keys.tolist(), shown(best.tolist()), scores.tolist(), extra)]
        return result

    def search_passages(self, questions: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows and scores of the top k passages: the interface `retriever.retrieve` runs."""
        results = self.search(questions, k, unit="passage")
        rows = np.full((len(questions), k), -1, dtype=np.int64)
        scores = np.full((len(questions), k), -np.inf, dtype=np.float32)
        for i, r in enumerate(results):
            for j, p in enumerate(r["passages"]):
                rows[i, j], scores[i, j] = p["row"], p["score"]
        return rows, scores


def _id_ranges(starts, ends) -> np.ndarray:
    """The vector ids starts[i] .. ends[i] - 1 of each i, in order (a passage's or a document's vectors)."""
    return np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in zip(starts, ends)] or [np.zeros(0, np.int64)])


def _offsets(meta: dict, ps: np.ndarray, pe: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The character start of each phrase's start vector and end of its end vector, widened from their
    stored unsigned type so that arithmetic on them cannot wrap."""
    return meta["char_start"][ps].astype(np.int32), meta["char_end"][pe].astype(np.int32)


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


def top_phrase(result: dict) -> dict | None:
    """The extractive answer of one `Searcher.search` result: its aggregated "answer" for a passage
    (document) search, else the phrase of its first passage (document), else its top phrase."""
    if "answer" in result:
        return result["answer"]
    units = result.get("passages") or result.get("documents")
    if units:
        return units[0]["phrase"]
    return result["phrases"][0] if result["phrases"] else None


def open_searcher(index: str | os.PathLike, model: str | os.PathLike, corpus: str | os.PathLike,
                  doc_index: str | os.PathLike | None = None, doc_model: str | os.PathLike | None = None,
                  config: SearchConfig | None = None, *, reranker: str | os.PathLike | None = None,
                  memory: str | os.PathLike | None = None, dtype=None, **settings) -> Searcher:
    """A pipeline's searcher, the one place one is made from paths: the phrase index and model, behind
    the document pre-filter when `doc_index` is given (with the `doc_model` it was built with), with
    `reranker` (an `odqa train-reranker` checkpoint) reordering each question's top passages and the
    answer memory at `memory` (`odqa build-memory`) lending its answers, where given; searching by
    `config` with `settings` (`SearchConfig`'s fields) in its place. `odqa.load`, the CLI (and so the
    server), `odqa run`, the demo and `train-query` make theirs here."""
    prefilter = None
    if doc_index:
        if not doc_model:
            raise InputError("--doc-index needs --doc-model (the document encoder it was built with)")
        from odqa.retriever.doc_index import DocRetriever
        prefilter = DocRetriever(doc_index, doc_model, corpus)
    return Searcher(index, model, corpus, config, prefilter=prefilter, dtype=dtype,
                    reranker=_load_reranker(reranker) if reranker else None,
                    memory=AnswerMemory(memory) if memory else None, **settings)


def _load_reranker(path: str | os.PathLike):
    from odqa.retriever.cross_encoder import CrossEncoder
    return CrossEncoder.from_pretrained(path)
