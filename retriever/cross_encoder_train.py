"""`odqa train-reranker`: train the cross-encoder reranker (retriever/cross_encoder.py) on the passages
the pipeline retrieves for the training questions (a retrieval file of `odqa retrieve`).

Each question whose top `depth` passages hold both kinds gives a group: one answer-bearing passage
and `negatives` passages without an answer, drawn from its retrieved ones per (seed, epoch, question);
the loss is the cross-entropy of the positive among its group (the localised contrastive loss of Gao,
Dai & Callan 2021, "Rethink Training of BERT Rerankers in Multi-Stage Retrieval Pipelines"): the
reranker learns to tell the answer's passage from the ones this retriever confuses with it.

Validation reranks each validation question's top `depth` passages: Top-1/5/10 and MRR against the
retriever's own order; the best MRR checkpoint is kept. At the end the weight of the reranker's score
beside the search's, z(search) + w x z(reranker), is tuned on validation for the best checkpoint and
stored in it (`weight` in cross_encoder.json), which `Searcher` reads.
"""
from __future__ import annotations

import logging
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from odqa.common.io import InputError, write_json
from odqa.common.metrics.retrieval import retrieval_metrics
from odqa.common.model_card import Card
from odqa.common.retrieval_file import read_results
from odqa.common.settings import needs
from odqa.common.trainer import MicroBatches, Task, check_resumed_settings, make_engine, permuted_batches, seeded, train
from odqa.retriever.args import RerankerTrainArgs
from odqa.retriever.cross_encoder import CrossEncoder, set_weight
from odqa.retriever.rerank import final_scores

log = logging.getLogger(__name__)
# Up to 32, where z(search) only breaks the reranker's ties: a well-trained reranker ranks best
# nearly alone (the demo's rr2 took 8, the end of a grid that stopped there).
WEIGHT_GRID = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def load_groups(path: str, depth: int, limit: int | None = None) -> tuple[list[dict], int]:
    """Training groups from a retrieval file: {question, positives, negatives} for each question whose
    top `depth` passages hold both kinds; and the number of questions read."""
    entries = read_results(path)[:limit]
    groups = []
    for e in entries:
        ctxs = e["ctxs"][:depth]
        pos = [c for c in ctxs if c["has_answer"]]
        neg = [c for c in ctxs if not c["has_answer"]]
        if pos and neg:
            groups.append({"question": e["question"], "positives": pos, "negatives": neg})
    return groups, len(entries)


def _collate(model: CrossEncoder, n_neg: int, seed: int):
    def collate(groups: list[dict]) -> dict:
        questions, passages, present = [], [], []
        for g in groups:
            # drawn per (seed, question): a resumed run that skips batches draws the same passages
            rng = random.Random(f"{seed}:{g['question']}")
            negs = rng.sample(g["negatives"], min(n_neg, len(g["negatives"])))
            group = [rng.choice(g["positives"])] + negs
            present.append([True] * len(group) + [False] * (n_neg + 1 - len(group)))
            questions += [g["question"]] * (n_neg + 1)
            passages += group + [{"title": "", "text": ""}] * (n_neg + 1 - len(group))
        return {**model.encode(questions, passages), "present": torch.tensor(present)}
    return collate


class GroupLoss:
    def __call__(self, model, batch: dict, step: int) -> tuple[torch.Tensor, dict]:
        present = batch["present"]
        scores = model(**{k: v for k, v in batch.items() if k != "present"}).float().view(present.shape)
        loss = F.cross_entropy(scores.masked_fill(~present, -1e4), torch.zeros(len(scores), dtype=torch.long,
                                                                               device=scores.device))
        return loss, {"loss": loss.item()}


def rerank_scores(model: CrossEncoder, entries: list[dict], depth: int) -> list[np.ndarray]:
    """The reranker's score of each entry's top `depth` passages."""
    from tqdm import tqdm
    return [model.score(e["question"], e["ctxs"][:depth]) for e in tqdm(entries, desc="rerank", unit=" q",
                                                                          mininterval=2, disable=None)]


def ranking_metrics(entries: list[dict], cross: list[np.ndarray], weight: float | None, depth: int) -> dict:
    """Top-1/5/10 and MRR of each question's top `depth` passages ordered by z(search) + weight x
    z(reranker) (weight None: the reranker alone; 0: the search's own order)."""
    hits = []
    for e, c in zip(entries, cross):
        ctxs = e["ctxs"][:depth]
        score = c if weight is None else final_scores([x["score"] for x in ctxs], c, weight)
        order = np.argsort(-np.asarray(score, dtype=np.float64), kind="stable")
        hits.append([bool(ctxs[i]["has_answer"]) for i in order])
    m = retrieval_metrics(hits, ks=(1, 5, 10), mrr_k=depth)
    return {k: v for k, v in m.items() if k.startswith(("Top-", "MRR"))}


def tune_weight(entries: list[dict], cross: list[np.ndarray], depth: int, grid=WEIGHT_GRID) -> tuple[float, list[dict]]:
    """The weight of the grid with the best validation MRR (the smallest on ties), and the grid's rows."""
    rows = [{"weight": w, **ranking_metrics(entries, cross, w, depth)} for w in grid]
    mrr = next(k for k in rows[0] if k.startswith("MRR"))
    best = max(rows, key=lambda r: (r[mrr], -r["weight"]))
    return best["weight"], rows


def param_groups(model: CrossEncoder, args: RerankerTrainArgs) -> list[dict]:
    """The new head at its own rate (it starts from nothing; the encoder only adapts), each split into
    decayed weights and undecayed biases and norms."""
    groups = []
    for head in (False, True):
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad and model.is_head(n) == head]
        for decay in (True, False):
            params = [p for n, p in named if (p.ndim > 1) == decay]
            groups.append({"params": params, "weight_decay": args.weight_decay if decay else 0.0,
                           **({"lr": args.head_lr} if head else {})})
    return groups


def train_reranker(args: RerankerTrainArgs) -> dict:
    needs(args, "train_file", "validation_file", "out_dir", "encoder")
    out = Path(args.out_dir)
    if args.resume:   # before anything is written over
        check_resumed_settings(out / "train_args.json", asdict(args))
    seeded(args.seed)
    if args.rerank_depth < 2:
        raise InputError(f"--rerank-depth must be at least 2 (a positive and a negative), not {args.rerank_depth}")
    model = CrossEncoder.from_encoder(args.encoder, args.max_tokens)
    groups, asked = load_groups(args.train_file, args.rerank_depth, args.max_train_examples)
    validation = read_results(args.validation_file)[:args.max_validation_examples]
    log.info("%d of %d training questions have answer-bearing and other passages in their top %d; %d validation",
             len(groups), asked, args.rerank_depth, len(validation))
    if len(groups) < args.batch_size:
        raise InputError(f"{args.train_file}: {len(groups)} questions with both kinds of passage in their top "
                         f"{args.rerank_depth}, fewer than one batch of {args.batch_size}")
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "train_args.json", asdict(args))

    def batches(epoch: int) -> MicroBatches:
        collate = _collate(model, args.negatives_per_question, args.seed + epoch)
        return MicroBatches(groups, permuted_batches(len(groups), args.batch_size, args.seed + epoch),
                            lambda exs, m: collate(exs))

    metric = f"MRR@{args.rerank_depth}"
    best_scores: dict = {}   # the best evaluation's scores so far, as the loop keeps its checkpoint: tuned on below

    def evaluate(m: CrossEncoder, rank: int, world: int) -> dict:
        scores = rerank_scores(m, validation, args.rerank_depth)
        result = ranking_metrics(validation, scores, None, args.rerank_depth)
        if not best_scores or result[metric] > best_scores["value"]:
            best_scores.update(value=result[metric], scores=scores)
        return result

    baseline = ranking_metrics(validation, [np.zeros(len(e["ctxs"][:args.rerank_depth])) for e in validation], 0.0, args.rerank_depth)
    log.info("the retriever's own order on validation: %s", {k: round(v, 2) for k, v in baseline.items()})
    task = Task(model=model, n_batches=len(groups) // args.batch_size, batches=batches, loss=GroupLoss(),
                save=lambda m, path: m.save_pretrained(path), evaluate=evaluate, metric=metric,
                groups=param_groups(model, args),
                card=Card("passage reranker", "train-reranker", args.encoder, [args.train_file], args.validation_file,
                          task="text-ranking"))
    state = train(task, args, make_engine(args), out, "train-reranker")
    if best_scores.get("value") != state["best"]["value"]:   # the best was evaluated before a resume
        best_scores["scores"] = rerank_scores(CrossEncoder.from_pretrained(out / "best").eval(), validation, args.rerank_depth)
    weight, grid = tune_weight(validation, best_scores["scores"], args.rerank_depth)
    for name in ("best", "last"):
        set_weight(out / name, weight)
    summary = {"train_questions": len(groups), "steps": state["global_step"], "retriever": baseline,
               "validation": [{k: v for k, v in e.items() if k != "epoch"} for e in state["evals"]],
               "best": state["best"], "weight": weight, "weight_grid": grid}
    write_json(out / "summary.json", summary)
    return summary
