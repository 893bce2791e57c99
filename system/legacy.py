"""The recipe as 0.1 spelled it, for what 0.1 wrote: flat preset files (`phrase_examples = 768`) and
the stage records of a demo directory, whose keys listed flat settings by name. A home built by 0.1 keeps
its finished stages: `odqa demo` sees that a stage record holds the key 0.1 made for the same recipe
and rewrites it as this release's key (system/demo.py). Goes in 0.3, with the deprecated spellings.

`OLD_DEFAULTS` is 0.1's RecipeConfig() as it was; `to_old` and `from_old` translate a recipe between the
two forms, and `old_stage_settings` is 0.1's `Recipe.stages()` settings of each stage, as it computed
them.
"""
from __future__ import annotations

import sys
from pathlib import Path

from odqa.common.settings import flat, from_flat
from odqa.retriever.args import BM25_GRID
from odqa.retriever.search_config import ANSWER_DEPTH, ANSWER_FILTER_RULES, ANSWER_TEMPERATURE

OLD_DEFAULTS = {
    "documents": None, "corpus": None, "train_questions": ["nq-dev", "tqa-dev"], "test_questions": ["nq-test", "tqa-test"],
    "validation_percent": 10.0, "validation_questions": 200, "encoder": None, "seed": 0, "phrase_examples": 768,
    "phrase_epochs": 1, "phrase_round_lrs": [], "phrase_batch": 16, "max_passage_tokens": 160, "title_phrases": False,
    "index_factory": None, "index_keep": 0.2, "query_epochs": 0, "query_examples": None, "query_rounds": 1,
    "query_final_fit": False, "doc_examples": 512, "doc_batch": 32, "doc_rounds": 1, "doc_negatives": "none",
    "max_doc_tokens": 64, "doc_validation_docs": 1000, "top_docs": 100, "lambda_questions": 200, "rerank_bm25": True,
    "reader_model": None, "reader_init": "warm", "reader_decoder_layers": 2, "reader_pointer": True,
    "reader_passage_prior": True, "reader_preset": "tiny", "pretrain_steps": 0, "reader_gold_steps": 150,
    "reader_gold_batch": 8, "reader_gold_evals": 1, "reader_steps": 150, "reader_batch": 4, "reader_lr": 1e-4,
    "reader_new_lr": 5e-4, "reader_span_loss": True, "reader_k": 5, "reader_passages": "bm25", "reader_questions": None,
    "reader_validation": 100, "reader_bf16": True, "reader_zero_stage": 0, "reader_freeze_embeddings": True,
    "reader_freeze_layers": 2, "text_maxlength": 128, "reranker": False, "reranker_questions": None, "rerank_depth": 20,
    "reranker_validation": 300, "reranker_batch": 8, "answer_memory": True, "run_limit": 100, "run_k": [5, 10],
    "baselines": ["bm25"], "examples": 3}

# 0.1's name -> where it lives now: (section or None for the recipe's own, flat name), one or more
SAME = ("documents", "corpus", "encoder", "seed", "phrase_round_lrs", "query_final_fit", "doc_rounds", "reader_model",
        "pretrain_steps", "reader_passages", "reader_questions", "reader_bf16", "answer_memory", "examples")
MOVED = {
    "train_questions": [("supervise", "questions")], "test_questions": [("run", "questions")],
    "validation_percent": [("supervise", "validation_percent")],
    "validation_questions": [("phrase", "max_validation_examples"), ("doc", "max_validation_examples")],
    "phrase_examples": [("phrase", "max_train_examples")], "phrase_epochs": [("phrase", "epochs")],
    "phrase_batch": [("phrase", "batch_size")], "max_passage_tokens": [("phrase", "max_passage_tokens")],
    "title_phrases": [("phrase", "title_phrases")], "index_factory": [("index", "factory")],
    "index_keep": [("index", "keep")], "query_examples": [("query", "max_train_examples")],
    "doc_examples": [("doc", "max_train_examples")], "doc_batch": [("doc", "batch_size")],
    "doc_negatives": [("doc", "negatives")], "max_doc_tokens": [("doc", "max_doc_tokens")],
    "doc_validation_docs": [("doc", "validation_docs")], "top_docs": [("search", "top_docs")],
    "lambda_questions": [("tune_lambda", "limit")], "reader_init": [(None, "reader_kind")],
    "reader_decoder_layers": [("reader_init", "decoder_layers")], "reader_pointer": [("reader_init", "pointer")],
    "reader_passage_prior": [("reader_init", "passage_prior")], "reader_preset": [("reader_init", "shape")],
    "reader_gold_steps": [(None, "gold_steps")], "reader_gold_batch": [(None, "gold_batch")],
    "reader_gold_evals": [(None, "gold_evals")], "reader_steps": [("reader_loop", "max_steps")],
    "reader_batch": [("reader_loop", "batch_size")], "reader_lr": [("reader_loop", "lr")],
    "reader_new_lr": [("reader_loop", "new_lr")], "reader_span_loss": [("reader", "span_loss")],
    "reader_k": [("reader", "k")], "reader_validation": [("reader", "max_validation_examples")],
    "reader_zero_stage": [("reader_loop", "zero_stage")],
    "reader_freeze_embeddings": [("reader_loop", "freeze_embeddings")],
    "reader_freeze_layers": [("reader_loop", "freeze_layers")],
    "text_maxlength": [("reader", "text_maxlength"), ("reading", "text_maxlength")],
    "reranker": [(None, "with_reranker")], "reranker_questions": [("reranker", "max_train_examples")],
    "rerank_depth": [("reranker", "rerank_depth"), ("search", "rerank_depth")],
    "reranker_validation": [("reranker", "max_validation_examples")], "reranker_batch": [("reranker", "batch_size")],
    "run_limit": [("run", "limit")], "run_k": [("run", "k")], "baselines": [("run", "baselines")]}
# and three that changed their meaning: query_epochs 0 was "no query stage", now query_rounds 0;
# rerank_bm25 is whether tune-lambda's BM25 grid is tried, now the grid itself
SPECIAL = ("query_epochs", "query_rounds", "rerank_bm25")
OLD_ONLY = set(MOVED) | set(SPECIAL) - {"query_rounds"}


def from_old(old: dict, complete: bool = True) -> dict:
    """A recipe's settings in this release's form (sections as tables) from 0.1's flat names: all of them
    (those not given: 0.1's defaults, the demo's here too), or with `complete=False` those given alone."""
    given, old = set(old), {**OLD_DEFAULTS, **old}
    new: dict = {name: old[name] for name in SAME if complete or name in given}
    for name, places in MOVED.items():
        for section, leaf in places if complete or name in given else ():
            (new.setdefault(section, {}) if section else new)[leaf] = old[name]
    if complete or given & {"query_epochs", "query_rounds"}:
        new["query_rounds"] = old["query_rounds"] if old["query_epochs"] else 0
        new.setdefault("query", {})["epochs"] = old["query_epochs"] or 2   # 0 meant no stage: epochs unused
    if complete or "rerank_bm25" in given:
        new.setdefault("tune_lambda", {})["bm25_grid"] = list(BM25_GRID) if old["rerank_bm25"] else [0.0]
    return new


def to_old(cfg) -> dict | None:
    """0.1's flat settings of the recipe `cfg`, or None where 0.1 could not say it (a setting it did not
    have, changed; two that were one setting, apart)."""
    sections = {f: flat(getattr(cfg, f)) for f in
                {section for places in MOVED.values() for section, _ in places if section} | {"query", "tune_lambda"}}
    old = {name: getattr(cfg, name) for name in SAME}
    for name, places in MOVED.items():
        values = [sections[s][leaf] if s else getattr(cfg, leaf) for s, leaf in places]
        if any(v != values[0] for v in values):
            return None
        old[name] = values[0]
    old["query_epochs"] = sections["query"]["epochs"] if cfg.query_rounds else 0
    old["query_rounds"] = cfg.query_rounds or 1
    grid = sections["tune_lambda"]["bm25_grid"]
    if list(grid) not in (list(BM25_GRID), [0.0]):
        return None
    old["rerank_bm25"] = list(grid) == list(BM25_GRID)
    # whatever 0.1 could not set must be as 0.1 ran it: the round trip gives `cfg` back
    return old if from_flat(type(cfg), from_old(old)) == cfg else None


def flat_preset(values: dict, path: Path) -> dict:
    """A preset file's settings as this release reads them: a file of 0.1's flat names is translated,
    with a one-line deprecation warning."""
    old = sorted(set(values) & OLD_ONLY)
    if not old:
        return values
    print(f"odqa: warning: preset {path} uses 0.1's flat names ({', '.join(old[:4])}{', ...' if len(old) > 4 else ''}), "
          f"which go in 0.3: write it in sections, as system/presets/full.toml is", file=sys.stderr)
    unknown = sorted(set(values) - set(OLD_DEFAULTS))
    if unknown:
        from odqa.common.io import InputError
        raise InputError(f"{path}: not recipe settings: {', '.join(unknown)}")
    return from_old(values, complete=False)   # only what the file names, each in its new place


def old_stage_settings(old: dict, corpus: Path) -> dict[str, dict]:
    """Each stage's settings as 0.1's `Recipe.stages()` wrote them into its key (`old`: `to_old`'s)."""
    c = old

    def changed(*names):
        return {n: c[n] for n in names if c[n] != OLD_DEFAULTS[n]}
    query = {"query_epochs": c["query_epochs"], "query_examples": c["query_examples"]} | changed("query_rounds", "seed")
    return {
        "data": {"documents": c["documents"], "corpus": str(corpus)},
        "supervise": {"questions": c["train_questions"], "validation_percent": c["validation_percent"]},
        "phrase": {k: c[k] for k in ("encoder", "phrase_examples", "phrase_epochs", "phrase_batch",
                                     "max_passage_tokens", "validation_questions")}
        | changed("phrase_round_lrs", "title_phrases", "seed"),
        "index": {"factory": c["index_factory"] or "default: OPQ,IVF,PQ", "keep": c["index_keep"]} | changed("seed"),
        "query": query,
        "doc": {k: c[k] for k in ("doc_examples", "doc_batch", "doc_rounds", "doc_negatives", "max_doc_tokens",
                                  "doc_validation_docs", "top_docs", "lambda_questions", "validation_questions",
                                  "rerank_bm25")} | changed("seed"),
        "refit": query,
        "reader": {k: c[k] for k in (
            "reader_model", "reader_init", "reader_decoder_layers", "reader_pointer", "reader_passage_prior",
            "reader_preset", "pretrain_steps", "reader_gold_steps", "reader_gold_batch", "reader_steps", "reader_batch",
            "reader_lr", "reader_new_lr", "reader_span_loss", "reader_k", "reader_questions", "reader_validation",
            "reader_bf16", "text_maxlength", "reader_zero_stage", "reader_freeze_embeddings", "reader_freeze_layers")}
        | changed("reader_gold_evals", "reader_passages", "seed"),
        "reranker": {k: c[k] for k in ("encoder", "reranker_questions", "rerank_depth", "reranker_validation",
                                       "reranker_batch")} | changed("seed"),
        "memory": {"questions": c["train_questions"]},
        "run": {k: c[k] for k in ("test_questions", "run_limit", "run_k", "baselines", "examples")}
        | {"answer_vote": [ANSWER_DEPTH, ANSWER_TEMPERATURE], "answer_filter": ANSWER_FILTER_RULES, "report": 2},
    }
