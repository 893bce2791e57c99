"""`odqa train-query`: query-side fine-tuning (DensePhrases Eq. 11), through the shared training loop.

The phrase index stays fixed; only the question encoders learn. Each epoch, the current model
retrieves the top `top_k` phrases of every training question, and the loss is
    -log  sum_{positive phrases} exp(s) / sum_{all top phrases} exp(s),   s = q_start.start + q_end.end
with the phrase vectors taken from the index: the stored float16 vectors for Flat, vectors
reconstructed from the codes for a compressed (SQ/PQ) index, so training sees what search sees.
A phrase is positive (`label`): "phrase" if its text matches an answer; "passage" if its passage
contains an answer; "document" if its document has a passage that does ("Too" paper, Eq. 5).
`passage_weight` adds that much of the "passage" loss to the label's, on the same questions.
With a document index (`doc_index`), the top phrases are mined behind that pre-filter, as the
pipeline scores them: the best phrase starting at each token of the question's top documents.
An epoch's candidates are kept in OUT/candidates/, so a resumed run trains on the ones it was given;
under a launcher the ranks mine them split (every rank the same model), each its share of the questions.
"""
from __future__ import annotations

import functools
import logging
import random
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from odqa.common.io import InputError, read_json, write_json
from odqa.common.metrics.answers import answer_em
from odqa.common.metrics.has_answer import has_answer
from odqa.common.model_card import Card
from odqa.common.questions import load_questions
from odqa.common.ranks import split_map
from odqa.common.settings import needs
from odqa.common.trainer import Task, check_resumed_settings, make_engine, seeded, train
from odqa.retriever.args import QueryTrainArgs
from odqa.retriever.phrase_data import encode_questions
from odqa.retriever.phrase_search import Phrases
from odqa.retriever.search_config import SearchConfig
from odqa.retriever.searcher import UNITS as LABELS
from odqa.retriever.searcher import Searcher

log = logging.getLogger(__name__)


def positives(searcher: Searcher, phrases: Phrases, question, label: str, doc_cache: dict) -> np.ndarray:
    a, out = searcher.artifacts, []
    for i in range(len(phrases)):
        _, _, _, row, char_start, char_end, in_title = phrases.at(i)
        passage = a.store[row]
        if label == "phrase":
            ok = answer_em(a.source(in_title, passage)[char_start:char_end], question.answers, question.regex)
        elif label == "passage":
            ok = has_answer(passage["text"], question.answers, question.regex)
        else:
            doc = passage["doc_id"]
            if doc not in doc_cache:
                doc_cache[doc] = [a.store[r]["text"] for r in a.rows_of_doc(doc)]
            ok = any(has_answer(t, question.answers, question.regex) for t in doc_cache[doc])
        out.append(bool(ok))
    return np.array(out)


class NoPositives(InputError):
    """No training question has a positive among its top phrases: the model has nothing to learn from."""


def mine_candidates(searcher: Searcher, questions, args: QueryTrainArgs, epoch: int,
                    parts: Path | None = None) -> list[dict]:
    """The questions with a positive among the current model's top phrases: their phrase ids and labels.
    Under a launcher each rank encodes and mines its share of the batches of 64 questions, and every rank
    gets every question's (common/ranks.py); `parts` keeps the finished batches of a mining cut short.
    A batch's questions are encoded together whatever the rank count, so 1 and 2 ranks mine alike."""
    model = searcher.artifacts.model
    doc_cache: dict = {}

    def mine(rows: list[int]) -> list[dict | None]:
        a, b = rows[0], rows[-1] + 1
        texts = [q.question for q in questions[a:b]]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            queries = searcher.queries(texts)
        model.train(was_training)
        if searcher.prefilter is None:
            retrieved = searcher.phrases.mips(queries.start, queries.end, args.top_k)   # batched MIPS
        else:   # the phrases of the top documents, as the pipeline scores them: every start, its best end
            retrieved = searcher.prefilter.search(queries, searcher.phrases)
        out = []
        for i, phrases in zip(rows, retrieved):
            q, phrases = questions[i], phrases[:args.top_k]
            pos = positives(searcher, phrases, q, args.label, doc_cache)
            if not pos.any():   # the passage term rides on the questions --label trains, never adds its own
                out.append(None)
                continue
            out.append({"question": i, "start": [int(x) for x in phrases.start_vec],
                        "end": [int(x) for x in phrases.end_vec], "positive": pos.tolist()})
            if args.passage_weight:
                out[-1]["passage_positive"] = (pos if args.label == "passage" else
                                               positives(searcher, phrases, q, "passage", doc_cache)).tolist()
        return out
    mined = split_map(mine, range(len(questions)), 64, parts, {"epoch": epoch}, desc=f"train-query candidates {epoch + 1}")
    found = [c for c in mined if c is not None]
    log.info("epoch %d: %d of %d questions have a positive among the top %d phrases",
             epoch + 1, len(found), len(questions), args.top_k)
    if not found:
        raise NoPositives(f"no training question has a positive {args.label} among its top {args.top_k} phrases")
    return found


class CandidateBatches(Sequence):
    """An epoch's candidates, shuffled by (seed, epoch), in `n_batches` batches of `batch_size` questions.
    The loop's step count is fixed before training, the number of questions with a positive is not: it
    is set by the first epoch's, a later epoch with more trains on a random `n_batches` of them, and one
    with fewer gives None (a skipped step) past its last."""

    def __init__(self, searcher: Searcher, questions, found: list[dict], n_batches: int, args: QueryTrainArgs,
                 epoch: int):
        self.searcher, self.questions, self.args, self.n = searcher, questions, args, n_batches
        self.found = list(found)
        random.Random(f"{args.seed}-{epoch}").shuffle(self.found)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, m: int):
        chunk = self.found[m * self.args.batch_size:(m + 1) * self.args.batch_size]
        if not chunk:
            return None
        a = self.searcher.artifacts
        index = a.index
        return {"questions": dict(encode_questions(a.tokenizer, [self.questions[c["question"]].question for c in chunk],
                                                   a.model.config.max_question_tokens)),
                "start": [torch.from_numpy(index.vectors("start", c["start"])).float() for c in chunk],
                "end": [torch.from_numpy(index.vectors("end", c["end"])).float() for c in chunk],
                "positive": [torch.tensor(c["positive"]) for c in chunk],
                "passage_positive": [torch.tensor(c.get("passage_positive", [False] * len(c["positive"])))
                                     for c in chunk]}


def query_loss(model, batch: dict, step: int, passage_weight: float = 0.0):
    """Eq. 11's -log (positives' share of the top phrases' softmax), averaged over the questions; with
    `passage_weight` plus that weight times the same over the phrases of answer-bearing passages."""
    enc = model(batch["questions"])
    qs, qe = enc["q_start"], enc["q_end"]
    loss = 0.0
    for b, (s_vec, e_vec, pos, ppos) in enumerate(zip(batch["start"], batch["end"], batch["positive"],
                                                      batch["passage_positive"])):
        scores = qs[b] @ s_vec.T + qe[b] @ e_vec.T
        total = torch.logsumexp(scores, 0)
        loss = loss + total - torch.logsumexp(scores[pos], 0)
        if passage_weight and ppos.any():
            loss = loss + passage_weight * (total - torch.logsumexp(scores[ppos], 0))
    loss = loss / len(batch["positive"])
    return loss, {"loss": loss.item()}


def train_query(args: QueryTrainArgs) -> dict:
    needs(args, "model", "index", "corpus", "out_dir")
    if args.label not in LABELS:
        raise InputError(f"--label must be one of {LABELS}")
    out = Path(args.out_dir)
    if args.resume:   # before anything is written over, or mined candidates are read back
        check_resumed_settings(out / "train_args.json", asdict(args))
    seeded(args.seed)
    searcher = Searcher.open(args.index, args.model, args.corpus, args.doc_index, args.doc_model,
                             SearchConfig(phrase=args.phrase, prefilter=args.prefilter),
                             trained=True)   # its model is trained, and saved whole
    model = searcher.artifacts.model
    for n, p in model.named_parameters():
        p.requires_grad_(n.startswith("q_"))
    questions = load_questions(args.questions, limit=args.max_train_examples)
    engine = make_engine(args)
    cache = out / "candidates"
    if engine.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if not args.resume and cache.exists():   # another run's: mined with another model
            shutil.rmtree(cache)
        write_json(out / "train_args.json", asdict(args))
    engine.barrier()

    mined: dict[int, list[dict]] = {}   # per process: epoch 1's are asked for twice, and a search is costly

    def candidates(epoch: int) -> list[dict]:
        if epoch not in mined:
            path = cache / f"epoch-{epoch + 1}.json"
            if path.exists():
                mined[epoch] = read_json(path)
            else:
                mined[epoch] = mine_candidates(searcher, questions, args, epoch, cache / f".epoch-{epoch + 1}.parts")
                if engine.rank == 0:
                    cache.mkdir(exist_ok=True)
                    write_json(path, mined[epoch], indent=None)
        return mined[epoch]

    # Counted on the first epoch's candidates (mined before training, kept for epoch 1): a count over
    # all questions would schedule the rate over steps that most questions, without a positive, skip.
    n_batches = -(-len(candidates(0)) // args.batch_size)

    def batches(epoch: int) -> CandidateBatches:
        return CandidateBatches(searcher, questions, candidates(epoch), n_batches, args, epoch)

    task = Task(model=model, n_batches=n_batches, batches=batches,
                loss=functools.partial(query_loss, passage_weight=args.passage_weight),
                save=lambda m, path: m.save_pretrained(path, searcher.artifacts.tokenizer),
                card=Card("phrase model, query-side tuned", "train-query", args.model, [str(args.questions)]))
    state = train(task, args, engine, out, "train-query")
    history = []
    for epoch in range(1, state["epoch"] + 1):
        losses = [h["loss"] for h in state["history"] if h["epoch"] == epoch]
        history.append({"epoch": epoch, "questions": len(candidates(epoch - 1)),
                        "loss": float(np.mean(losses)) if losses else None})
    if engine.rank == 0:
        write_json(out / "train_query.json", {"args": asdict(args), "history": history})
    return {"history": history, "steps": state["global_step"]}
