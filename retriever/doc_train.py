"""`odqa train-doc`: train DHR's document retriever.

Each training question (a supervision example) has one positive, the document of its supervision
passage, and hard negatives, documents that hold no answer:
  negatives="abstract"  the top BM25 documents by title + abstract (DHR's "abstract negatives"),
  negatives="model"     the top documents of the `--encoder` checkpoint itself (DHR's iterative
                        training: round 2 starts from round 1 and mines with it),
  negatives="none"      in-batch only.
Loss: cross-entropy of `scale * cos(q, d)` over the batch's positives and negatives (every other
question's documents are in-batch negatives), with documents that are this question's positive masked.
Validation each epoch: document Top-1/5/20/100 over the whole corpus, a hit being any document
with an answer-bearing passage; the best Top-20 checkpoint is kept. `validation_docs=N` ranks among
the validation positives and N random other documents instead, for corpora too large to encode
each epoch (the numbers are then higher than over the whole corpus).
"""
from __future__ import annotations

import logging
import random
from dataclasses import asdict
from pathlib import Path

import faiss
import numpy as np
import torch
import torch.nn.functional as F

from odqa.common.answer_index import AnswerIndex
from odqa.common.corpus import DocumentTable, PassageStore
from odqa.common.io import InputError, read_jsonl, write_json
from odqa.common.metrics.retrieval import retrieval_metrics
from odqa.common.model_card import Card
from odqa.common.settings import needs
from odqa.common.trainer import MicroBatches, Task, check_resumed_settings, make_engine, permuted_batches, seeded, train
from odqa.retriever.args import DocTrainArgs
from odqa.retriever.bm25 import BM25Index
from odqa.retriever.doc_encoder import (
    DocEncoder,
    DocEncoderConfig,
    encode_all_docs,
    encode_questions,
    is_doc_checkpoint,
    tokenize_docs,
    tokenize_questions,
)
from odqa.retriever.lm import load_tokenizer

log = logging.getLogger(__name__)
NEGATIVES = ("abstract", "model", "none")
MINE_DEPTH = 30


def load_doc_examples(path: str, table: DocumentTable, row_of_passage: dict[str, int],
                      answers: AnswerIndex, limit: int | None = None) -> list[dict]:
    """One example per question: {question, pos (doc row), answer_docs (rows with an answer)}."""
    out, seen = [], set()
    for lineno, ex in read_jsonl(path):
        for key in ("question", "answers", "passage_id"):
            if key not in ex:
                raise InputError(f"{path}:{lineno}: supervision example without {key!r}")
        if ex["passage_id"] not in row_of_passage:
            raise InputError(f"{path}:{lineno}: passage {ex['passage_id']!r} is not in the corpus {table.dir}")
        if ex["question"] in seen:
            continue
        seen.add(ex["question"])
        rows = answers.find(ex["answers"], bool(ex.get("regex")))
        answer_docs = sorted({int(d) for d in table.doc_of_passage[rows]})
        out.append({"question": ex["question"], "pos": int(table.doc_of_passage[row_of_passage[ex["passage_id"]]]),
                    "answer_docs": answer_docs})
        if limit and len(out) >= limit:
            break
    if not out:
        raise InputError(f"{path}: no examples")
    return out


def mine_negatives(examples: list[dict], ranked: np.ndarray, n: int) -> None:
    """Each example's first n ranked documents that hold no answer become its negatives."""
    for ex, docs in zip(examples, ranked):
        bad = set(ex["answer_docs"]) | {ex["pos"]}
        ex["negatives"] = [int(d) for d in docs if d >= 0 and int(d) not in bad][:n]


def abstract_ranking(table: DocumentTable, questions: list[str], depth: int) -> np.ndarray:
    bm25 = BM25Index.from_texts((f"{d['title']} {d.get('abstract') or ''}" for d in table.docs), show_progress=False)
    rows, _ = bm25.search_passages(questions, depth)
    return rows


def model_ranking(model: DocEncoder, tokenizer, table: DocumentTable, questions: list[str], depth: int,
                  rows: np.ndarray | None = None) -> np.ndarray:
    """Each question's top documents (table rows), among `rows` if given, else among all."""
    docs = table.docs if rows is None else [table.docs[r] for r in rows]   # all: read as encoded, not held
    rows = np.arange(len(table)) if rows is None else rows
    index = faiss.IndexFlatIP(model.doc_lm.config.hidden_size)
    index.add(encode_all_docs(model, tokenizer, docs, desc="encode documents"))
    _, found = index.search(encode_questions(model, tokenizer, questions), min(depth, len(rows)))
    return np.where(found >= 0, rows[found], -1)


def validation_rows(table: DocumentTable, examples: list[dict], n_docs: int, seed: int) -> np.ndarray | None:
    """The positives plus n_docs random other documents (None: all documents)."""
    if not n_docs or n_docs >= len(table):
        return None
    positives = np.unique([e["pos"] for e in examples])
    others = np.setdiff1d(np.arange(len(table)), positives)
    sample = np.random.default_rng(seed).choice(others, min(n_docs, len(others)), replace=False)
    return np.sort(np.concatenate([positives, sample]))


def doc_metrics(model: DocEncoder, tokenizer, table: DocumentTable, examples: list[dict],
                rows: np.ndarray | None = None) -> dict:
    ranked = model_ranking(model, tokenizer, table, [e["question"] for e in examples], 100, rows)
    hits = [[int(d) in set(e["answer_docs"]) for d in docs] for e, docs in zip(examples, ranked)]
    return retrieval_metrics(hits)


class DocLoss:
    def __init__(self, scale: float):
        self.scale = scale

    def __call__(self, model: DocEncoder, batch: dict, step: int) -> tuple[torch.Tensor, dict]:
        q, d = model(batch["questions"], batch["docs"])            # d: positives first, then negatives
        scores = self.scale * q @ d.T
        # Another column holding this question's positive document (a duplicate) is not a negative.
        same = batch["doc_rows"].unsqueeze(0) == batch["doc_rows"][: len(q)].unsqueeze(1)
        same[torch.arange(len(q)), torch.arange(len(q))] = False
        loss = F.cross_entropy(scores.masked_fill(same, -1e4), torch.arange(len(q)))
        return loss, {"loss": loss.item()}


def _collate(tokenizer, table: DocumentTable, cfg: DocEncoderConfig, n_neg: int, seed: int):
    def collate(examples: list[dict]) -> dict:
        pos = [e["pos"] for e in examples]
        # Negatives drawn per (seed, epoch, question), so a resumed run skipping batches draws the same.
        negs = [d for e in examples for d in random.Random(f"{seed}:{e['question']}").sample(
            e.get("negatives", []), min(n_neg, len(e.get("negatives", []))))]
        rows = pos + negs
        return {"questions": tokenize_questions(tokenizer, [e["question"] for e in examples], cfg.max_question_tokens),
                "docs": tokenize_docs(tokenizer, [table.docs[r] for r in rows], cfg.max_doc_tokens),
                "doc_rows": torch.tensor(rows)}
    return collate


def train_doc(args: DocTrainArgs) -> dict:
    needs(args, "train_file", "validation_file", "corpus", "out_dir")
    needs(args.model_config, "encoder")
    if args.negatives not in NEGATIVES:
        raise InputError(f"negatives must be one of {NEGATIVES}, not {args.negatives!r}")
    out = Path(args.out_dir)
    if args.resume:   # before anything is written over
        check_resumed_settings(out / "train_args.json", asdict(args))
    seeded(args.seed)
    encoder = args.model_config.encoder
    if is_doc_checkpoint(encoder):
        model = DocEncoder.from_pretrained(encoder)
    else:
        if args.negatives == "model":
            raise InputError(f"--negatives model mines with a trained document encoder; {encoder} is not one")
        model = DocEncoder(args.model_config)
    tokenizer = load_tokenizer(encoder)
    table = DocumentTable(args.corpus)
    # the rows of the supervision's passages only: every passage's would be gigabytes at 21M passages
    wanted = {ex.get("passage_id") for path in (args.train_file, args.validation_file)
              for _, ex in read_jsonl(path) if isinstance(ex, dict)}
    store = PassageStore(args.corpus)
    row_of_passage = store.rows_of(wanted)
    answers = AnswerIndex.open(args.corpus)
    store.close()
    train_ex = load_doc_examples(args.train_file, table, row_of_passage, answers, args.max_train_examples)
    val_ex = load_doc_examples(args.validation_file, table, row_of_passage, answers, args.max_validation_examples)
    questions = [e["question"] for e in train_ex]
    if args.negatives == "abstract":
        mine_negatives(train_ex, abstract_ranking(table, questions, MINE_DEPTH), args.negatives_per_question)
    elif args.negatives == "model":
        mine_negatives(train_ex, model_ranking(model, tokenizer, table, questions, MINE_DEPTH), args.negatives_per_question)
    with_neg = sum(bool(e.get("negatives")) for e in train_ex)
    log.info("%d training questions (%d with %s negatives), %d validation", len(train_ex), with_neg, args.negatives, len(val_ex))
    if len(train_ex) < args.batch_size:
        raise InputError(f"{args.train_file}: {len(train_ex)} questions, fewer than one batch of {args.batch_size}")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_args.json", asdict(args))

    def batches(epoch: int) -> MicroBatches:
        # the same order (and negatives) after a resume
        collate = _collate(tokenizer, table, model.config, args.negatives_per_question, args.seed + epoch)
        return MicroBatches(train_ex, permuted_batches(len(train_ex), args.batch_size, args.seed + epoch),
                            lambda exs, m: collate(exs))

    val_rows = validation_rows(table, val_ex, args.validation_docs, args.seed)

    def evaluate(m: DocEncoder, rank: int, world: int) -> dict:
        metrics = doc_metrics(m, tokenizer, table, val_ex, val_rows)
        log.info("document retrieval on validation: %s", {k: round(v, 2) for k, v in metrics.items()})
        return metrics

    task = Task(model=model, n_batches=len(train_ex) // args.batch_size, batches=batches,
                loss=DocLoss(model.config.scale), save=lambda m, path: m.save_pretrained(path, tokenizer),
                evaluate=evaluate, metric="Top-20",
                card=Card("document encoder", "train-doc", encoder, [args.train_file], args.validation_file,
                          task="text-retrieval"))
    state = train(task, args, make_engine(args), out, "train-doc")
    validation = [{k: v for k, v in e.items() if k not in ("step", "epoch")} for e in state["evals"]]
    summary = {"best_top20": state["best"]["value"], "validation_top20": [e["Top-20"] for e in validation],
               "steps": state["global_step"], "validation": validation, "train_questions": len(train_ex),
               "with_negatives": with_neg,
               "final_loss": state["history"][-1]["loss"] if state["history"] else None}
    write_json(out / "summary.json", summary)
    return summary
