"""A recipe's stages, usable one by one from Python and run in order by `odqa demo` (system/demo.py):

    data       fetch the data pack (or take `documents`); build passages and documents; BM25 index
    supervise  answer-bearing passages for the training questions (NQ-dev, TQA-dev)
    phrase     train the phrase and question encoders (retriever.phrase_train); where phrase_round_lrs
               names more rounds, each is one epoch on a fresh schedule from the round before's best
    index      dump every passage's phrase vectors; faiss phrase index
    query      query-side fine-tuning of the question encoders against that index (DensePhrases Eq. 11),
               in query_rounds rounds of query_epochs; a stage only where query_epochs > 0 (the full preset)
    doc        train the document encoder (DHR), one or two rounds; document index; tune lambda
    refit      (query_final_fit, the full preset) the query rounds again, on the training and validation
               questions both, once validation has tuned lambda with the rounds that did not see it
    reader     a bert2bert warm-started from the encoder, or a T5 (SentencePiece + preset, or any
               checkpoint, optional span-corruption pretraining); the gold passage alone, then FiD on
               the training questions' BM25 passages or the pipeline's own (DeepSpeed or accelerate)
    reranker   (opt-in: `reranker`) a cross-encoder passage reranker trained on the pipeline's top
               `rerank_depth` passages of the training questions; `run` and `ask` then read through it
    memory     (`answer_memory`, on by default) the training question sets encoded by the search model's
               question encoders: `run` and `ask` let a question's nearest ones vote for their answers
    run        `odqa run` on a slice of NQ-test and TQA-test: the report table

    r = Recipe(preset_config("full"), "runs/mine")       # every stage writes under runs/mine
    r.build_data(); r.supervise(); r.train_phrase(); r.build_phrase_index(); ...
    r.stages()                                            # the schedule: each stage, its key's settings

Each verb is one stage: it reads what the stages before it wrote in the run directory (`path`), and
with `resume` goes on from its own checkpoints.
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Callable

from odqa.common import datapack
from odqa.common.artifact import read_manifest
from odqa.common.corpus import PassageStore, build_corpus, corpus_info
from odqa.common.io import InputError, read_json, read_jsonl, write_jsonl
from odqa.common.paths import default_corpus, default_documents, default_encoder
from odqa.common.questions import load_questions, question_set_name, split_limit
from odqa.retriever.args import ANSWER_DEPTH, ANSWER_FILTER_RULES, ANSWER_TEMPERATURE
from odqa.system.estimate import Estimates
from odqa.system.recipe_config import RecipeConfig, changed

log = logging.getLogger(__name__)


class Stage:
    def __init__(self, name: str, what: str, estimate_s: float, fn: Callable[[bool], dict],
                 settings: dict, outputs: list[Path], clean: list[Path] = ()):
        self.name, self.what, self.estimate_s, self.fn = name, what, estimate_s, fn
        self.settings, self.outputs, self.clean = settings, outputs, list(clean)


class Recipe:
    def __init__(self, cfg: RecipeConfig, out_dir: str | Path):
        self.cfg, self.out = cfg, Path(out_dir)
        self.corpus = Path(cfg.corpus) if cfg.corpus else default_corpus()
        self.encoder = cfg.encoder or str(default_encoder())
        self._test_sizes: dict[str, int] = {}  # stages() runs before every stage: count each set once
        self.p = {name: self.out / name for name in (
            "supervision", "phrase", "phrase-dump", "phrase-index", "query", "query-final", "query-final-data",
            "doc-r1", "doc-r2", "doc-index",
            "reader-init", "reader-pretrain", "reader-data", "reader-gold", "reader", "reranker-data", "reranker",
            "memory", "run")}

    # --- the stages, in order -------------------------------------------------------------------
    def estimates(self) -> Estimates:
        return Estimates(self.cfg, self._sizes(), self._test_size, self._reader_bf16(), self._reader_frozen())

    def stages(self) -> list[Stage]:
        c, p, e = self.cfg, self.p, self.estimates()
        n_pass, n_docs = e.n_pass, e.n_docs
        phrase_rounds = f", {1 + len(c.phrase_round_lrs)} rounds" if c.phrase_round_lrs else ""
        query_settings = {"query_epochs": c.query_epochs, "query_examples": c.query_examples} | changed(c, "query_rounds", "seed")
        return [
            Stage("data", "fetch the data pack, build passages and documents, BM25 index", e.data(),
                  self.build_data, {"documents": c.documents, "corpus": str(self.corpus)}, [self.corpus / "bm25"]),
            Stage("supervise", "distant supervision: answer-bearing passages of the training questions",
                  e.supervise(), self.supervise,
                  {"questions": c.train_questions, "validation_percent": c.validation_percent},
                  [p["supervision"] / "train.jsonl"], [p["supervision"]]),
            Stage("phrase", f"train the phrase encoder ({e.phrase_steps} steps of {c.phrase_batch}{phrase_rounds})",
                  e.phrase(), self.train_phrase,
                  {k: getattr(c, k) for k in ("encoder", "phrase_examples", "phrase_epochs", "phrase_batch",
                                              "max_passage_tokens", "validation_questions")}
                  | changed(c, "phrase_round_lrs", "title_phrases", "seed"),
                  [self.phrase_checkpoint()], self.phrase_rounds()),
            Stage("index", f"dump the phrase vectors of {n_pass:,} passages, "
                           + (f"fit the phrase filter, keep {c.index_keep:.0%}, " if c.index_keep < 1 else "")
                           + f"{c.index_factory or 'OPQ + IVF-PQ'} index",
                  e.index(),
                  # The default's kind is in the key, so a run made under an older default is rebuilt.
                  self.build_phrase_index,
                  {"factory": c.index_factory or "default: OPQ,IVF,PQ", "keep": c.index_keep} | changed(c, "seed"),
                  [p["phrase-index"]],
                  [p["phrase-dump"], p["phrase-index"]]),
            *([Stage("query", f"query-side fine-tuning against the index ({c.query_rounds * c.query_epochs} epochs "
                              f"of {e.query_questions:,} questions"
                              + (f", {c.query_rounds} rounds)" if c.query_rounds > 1 else ")"),
                     e.query(), self.tune_query, query_settings,
                     # the final fit's rounds go too: they came from this stage's settings
                     [], self.query_rounds() + self.query_rounds(final=True))]
              if c.query_epochs else []),
            Stage("doc", f"train the document encoder ({e.doc_steps} steps), index {n_docs:,} documents, tune lambda",
                  e.doc(),
                  self.train_doc, {k: getattr(c, k) for k in ("doc_examples", "doc_batch", "doc_rounds", "doc_negatives",
                                                              "max_doc_tokens", "doc_validation_docs", "top_docs",
                                                              "lambda_questions", "validation_questions",
                                                              "rerank_bm25")} | changed(c, "seed"),
                  [self.doc_model(), p["doc-index"]], [p["doc-r1"], p["doc-r2"], p["doc-index"]]),
            *([Stage("refit", "the query rounds again, on the training and validation questions",
                     e.refit(), self.refit_query,
                     query_settings, [], self.query_rounds(final=True) + [p["query-final-data"]])]
              if c.query_epochs and c.query_final_fit else []),
            Stage("reader", f"train the FiD reader ({self._reader_plan()})", e.reader(),
                  self.train_reader, {k: getattr(c, k) for k in (
                      "reader_model", "reader_init", "reader_decoder_layers", "reader_pointer", "reader_passage_prior",
                      "reader_preset",
                      "pretrain_steps", "reader_gold_steps", "reader_gold_batch", "reader_steps", "reader_batch", "reader_lr",
                      "reader_new_lr", "reader_span_loss", "reader_k", "reader_questions", "reader_validation",
                      "reader_bf16", "text_maxlength", "reader_zero_stage", "reader_freeze_embeddings",
                      "reader_freeze_layers")} | changed(c, "reader_gold_evals", "reader_passages", "seed"),
                  [p["reader"] / "best"],
                  [p["reader-init"], p["reader-pretrain"], p["reader-data"], p["reader-gold"], p["reader"]]),
            # After the reader, so that turning it on or off reruns the run stage only.
            *([Stage("reranker", f"train the passage reranker on the top {c.rerank_depth} passages of "
                                 f"{e.rerank_questions:,} training questions",
                     e.reranker(),
                     self.train_reranker, {k: getattr(c, k) for k in ("encoder", "reranker_questions", "rerank_depth",
                                                                      "reranker_validation", "reranker_batch")}
                     | changed(c, "seed"),
                     [p["reranker"] / "best"], [p["reranker-data"], p["reranker"]])]
              if c.reranker else []),
            # Before the run, after the reader: turning it on or off reruns the run stage only.
            *([Stage("memory", f"the answer memory: the questions of {', '.join(c.train_questions)}, encoded by "
                               f"the search model", e.memory(),
                     self.build_memory,
                     {"questions": c.train_questions}, [p["memory"]], [p["memory"]])]
              if c.answer_memory else []),
            Stage("run", f"`odqa run` on {c.run_limit or 'all'} questions of {', '.join(c.test_questions)}, "
                         f"k = {', '.join(map(str, c.run_k))}",
                  e.run(), self.evaluate,
                  {k: getattr(c, k) for k in ("test_questions", "run_limit", "run_k", "baselines", "examples")}
                  # the extractive answer's vote and filter: a run made under older ones is made again; the
                  # report's columns (2: F1, and the memory's answer in a column of its own) likewise
                  | {"answer_vote": [ANSWER_DEPTH, ANSWER_TEMPERATURE], "answer_filter": ANSWER_FILTER_RULES,
                     "report": 2},
                  [p["run"] / "report.json"], [p["run"]]),
        ]

    def _reader_plan(self) -> str:
        c = self.cfg
        parts = [f"{c.pretrain_steps} pretraining"] if c.reader_init == "t5" and c.pretrain_steps else []
        if c.reader_gold_steps:
            parts.append(f"{c.reader_gold_steps} gold-passage steps")
        return " + ".join(parts + [f"{c.reader_steps} FiD steps, k={c.reader_k}"])

    def _reader_bf16(self) -> bool:
        from odqa.common.device import cpu_has_bf16
        return self.cfg.reader_bf16 and cpu_has_bf16()

    def _reader_frozen(self) -> dict:
        """What the reader's training holds fixed: nothing for a from-scratch T5, whose embeddings are
        random and must learn."""
        c = self.cfg
        if c.reader_init == "t5" and not c.reader_model:
            return {"freeze_embeddings": False, "freeze_layers": 0}
        return {"freeze_embeddings": c.reader_freeze_embeddings, "freeze_layers": c.reader_freeze_layers}

    def _sizes(self) -> tuple[int, int, int]:
        """Passages, documents, training examples: as built, or the default data's before they are."""
        passages, documents, train = 12_374, 10_033, 6_725
        if (self.corpus / "corpus.json").exists():
            info = corpus_info(self.corpus)
            passages, documents = info["passages"], info["documents"]
        if (self.p["supervision"] / "stats.json").exists():
            train = read_json(self.p["supervision"] / "stats.json")["examples"]["train"]
        return passages, documents, train

    def _test_size(self, name: str) -> int:
        """Questions `run` asks of a test set (NQ-test and TQA-test average 7,462 before they are fetched)."""
        limit = split_limit(name, self.cfg.run_limit)[1]
        if limit is not None:
            return limit
        if name not in self._test_sizes:
            try:
                self._test_sizes[name] = len(load_questions(name))
            except InputError:
                return 7_462
        return self._test_sizes[name]

    def build_data(self, resume: bool = False) -> dict:
        if self.cfg.documents is None:
            datapack.fetch()
        inputs = [Path(self.cfg.documents) if self.cfg.documents else default_documents()]
        info = ensure_corpus(inputs, self.corpus)
        from odqa.retriever.bm25 import BM25Index
        BM25Index.open(self.corpus)          # builds and caches the BM25 index on first use
        return {"passages": info["passages"], "documents": info["documents"]}

    def supervise(self, resume: bool = False) -> dict:
        from odqa.retriever.supervise import supervise
        stats = supervise(self.cfg.train_questions, self.corpus, self.p["supervision"],
                          validation_percent=self.cfg.validation_percent)
        return stats["examples"]

    def train_phrase(self, resume: bool = False) -> dict:
        """Round 1 from the encoder; each further round one more epoch from the round before's best on a
        fresh schedule (docs/notes/retrieval.md: the second epoch so run reads the gold passage 31.25 against 25.75)."""
        from odqa.retriever.phrase_train import PhraseTrainArgs, train
        c, sup = self.cfg, self.p["supervision"]
        rounds = self.phrase_rounds()
        args = PhraseTrainArgs(train_file=str(sup / "train.jsonl"), validation_file=str(sup / "validation.jsonl"),
                               out_dir=str(rounds[0]), encoder=self.encoder, max_passage_tokens=c.max_passage_tokens,
                               epochs=c.phrase_epochs, batch_size=c.phrase_batch, max_train_examples=c.phrase_examples,
                               max_validation_examples=c.validation_questions, title_phrases=c.title_phrases,
                               resume=resume, seed=PhraseTrainArgs.seed + c.seed)
        r = train(args)
        result = {"validation_em": [r["best_em"]], "steps": r["steps"]}
        for lr, out in zip(c.phrase_round_lrs, rounds[1:]):
            args = replace(args, encoder=str(Path(args.out_dir) / "best"), out_dir=str(out), epochs=1, lr=lr,
                           seed=args.seed + 1)
            r = train(args)
            result["validation_em"].append(r["best_em"])
            result["steps"] += r["steps"]
        return result

    def phrase_rounds(self) -> list[Path]:
        return [self.p["phrase"]] + [self.out / f"phrase-r{i}" for i in range(2, 2 + len(self.cfg.phrase_round_lrs))]

    def phrase_checkpoint(self) -> Path:
        """The phrase model the index is built with: the last round's best."""
        return self.phrase_rounds()[-1] / "best"

    def build_phrase_index(self, resume: bool = False) -> dict:
        from odqa.retriever.phrase_dump import dump_phrases
        from odqa.retriever.phrase_index import build_index
        c, sup = self.cfg, self.p["supervision"]
        d = dump_phrases(self.phrase_checkpoint(), self.corpus, self.p["phrase-dump"])
        result = {"dumped_per_passage": round(d["vectors_per_passage"], 1)}
        if c.index_keep < 1:
            from odqa.retriever.phrase_filter import train_filter
            table = train_filter(self.p["phrase-dump"], sup / "train.jsonl", sup / "validation.jsonl", self.corpus,
                                 seed=c.seed)
            kept = [row["answer_recall"] for row in table["calibration"] if row["keep"] == c.index_keep]
            if kept:
                result["answer_phrases_kept"] = round(100 * kept[0], 1)
        m = build_index(self.p["phrase-dump"], self.p["phrase-index"], self.corpus, factory=c.index_factory,
                        keep=c.index_keep, seed=c.seed)
        return {**result, "factory": m["factory"], "vectors": m["vectors"],
                "vectors_per_passage": round(m["vectors_per_passage"], 1),
                "bytes_per_passage": round(m["bytes_per_passage"])}

    def tune_query(self, resume: bool = False) -> dict:
        """Train the question encoders against the vectors the index holds (reconstructed from its codes),
        which wins back what compression costs the phrase encoder's own questions (docs/notes/retrieval.md), in
        rounds: each mines its candidates with the round before's model."""
        return self._query_rounds(self.p["supervision"] / "train.jsonl", self.query_rounds(), resume)

    def refit_query(self, resume: bool = False) -> dict:
        """The query rounds once more, from the same phrase model with the same seeds, on the training and
        validation questions. Validation cannot judge a model that trained on it, so this runs after the
        doc stage has tuned lambda on validation with the rounds that did not see it; three seeds of it
        beat three of the train-only rounds on both test sets (docs/notes/retrieval.md, "A final fit")."""
        sup, data = self.p["supervision"], self.p["query-final-data"]
        questions = data / "train+validation.jsonl"
        if not (resume and questions.exists()):
            data.mkdir(parents=True, exist_ok=True)
            write_jsonl(questions, [row for split in ("train", "validation")
                                    for _, row in read_jsonl(sup / f"{split}.jsonl")])
        return self._query_rounds(questions, self.query_rounds(final=True), resume)

    def _query_rounds(self, questions: Path, rounds: list[Path], resume: bool) -> dict:
        from odqa.retriever.args import QueryTrainArgs
        from odqa.retriever.query_train import NoPositives, train_query
        args = QueryTrainArgs(model=str(self.phrase_checkpoint()), index=str(self.p["phrase-index"]),
                              corpus=str(self.corpus), out_dir=str(rounds[0]),
                              questions=str(questions), epochs=self.cfg.query_epochs,
                              max_questions=self.cfg.query_examples, resume=resume,
                              seed=QueryTrainArgs.seed + self.cfg.seed)
        history = []
        for i, out in enumerate(rounds):
            try:
                r = train_query(replace(args, out_dir=str(out), seed=args.seed + i))
            except NoPositives as e:   # a phrase model too weak to find any answer: search with it as it is
                for later in rounds[i:]:
                    shutil.rmtree(later, ignore_errors=True)
                if not history:
                    return {"epochs": 0, "skipped": str(e)}
                break
            history += r["history"]
            args = replace(args, model=str(out / "last"))
        return {"epochs": len(history), "questions_with_positive": [h["questions"] for h in history],
                "loss": [round(h["loss"], 4) for h in history if h["loss"] is not None]}

    def query_rounds(self, final: bool = False) -> list[Path]:
        first = self.p["query-final" if final else "query"]
        return [first] + [first.with_name(f"{first.name}-r{i}") for i in range(2, self.cfg.query_rounds + 1)]

    def phrase_model(self, final: bool = True) -> Path:
        """The phrase model searches run with: the last query-tuned one where the query stage made one,
        the final fit's where it ran (`final=False`: never, for what validation tunes)."""
        from odqa.retriever.phrase_model import is_phrase_checkpoint
        if self.cfg.query_epochs:
            rounds = self.query_rounds() + (self.query_rounds(final=True) if final and self.cfg.query_final_fit else [])
            for out in reversed(rounds):
                if is_phrase_checkpoint(out / "last"):
                    return out / "last"
        return self.phrase_checkpoint()

    def train_doc(self, resume: bool = False) -> dict:
        from odqa.retriever.doc_index import build_doc_index
        from odqa.retriever.doc_train import DocTrainArgs, train_doc
        c, sup = self.cfg, self.p["supervision"]
        base = DocTrainArgs(train_file=str(sup / "train.jsonl"), validation_file=str(sup / "validation.jsonl"),
                            corpus=str(self.corpus), out_dir=str(self.p["doc-r1"]), encoder=self.encoder,
                            negatives=c.doc_negatives, batch_size=c.doc_batch,
                            max_doc_tokens=c.max_doc_tokens, max_train_examples=c.doc_examples,
                            max_validation_examples=c.validation_questions, validation_docs=c.doc_validation_docs,
                            resume=resume, seed=DocTrainArgs.seed + c.seed)
        result = {"round 1 Top-20": train_doc(base)["best_top20"]}
        model = self.p["doc-r1"] / "best"
        if c.doc_rounds > 1:
            r2 = train_doc(replace(base, out_dir=str(self.p["doc-r2"]), encoder=str(model), negatives="model"))
            result["round 2 Top-20"] = r2["best_top20"]
            model = self.p["doc-r2"] / "best"
        build_doc_index(model, self.corpus, self.p["doc-index"])
        from odqa.retriever.tune_lambda import BM25_GRID, tune_searcher_lambda
        tuned = tune_searcher_lambda(self.searcher(final=False), load_questions(sup / "validation.jsonl"),
                                     limit=c.lambda_questions, bm25_grid=BM25_GRID if c.rerank_bm25 else (0.0,))
        return {**result, "lambda": tuned["lambda"], "bm25_weight": tuned["bm25_weight"]}

    def doc_model(self) -> Path:
        return (self.p["doc-r2"] if self.cfg.doc_rounds > 1 else self.p["doc-r1"]) / "best"

    def searcher(self, reranked: bool = False, final: bool = True, memory: bool = False):
        """The pipeline's phrase search behind its pre-filter; with `reranked`, behind the reranker too
        where this demo trains one; with `memory`, consulting the answer memory where it builds one;
        `final=False`: with the query rounds that did not see validation."""
        from odqa.retriever.searcher import open_searcher
        return open_searcher(self.p["phrase-index"], self.phrase_model(final), self.corpus, self.p["doc-index"],
                             self.doc_model(), top_docs=self.cfg.top_docs, reranker=self.reranker() if reranked else None,
                             rerank_depth=self.cfg.rerank_depth, memory=self.memory() if memory else None)

    def reranker(self) -> Path | None:
        return self.p["reranker"] / "best" if self.cfg.reranker else None

    def train_reader(self, resume: bool = False) -> dict:
        from odqa.reader.args import LoopArgs
        from odqa.reader.fid_train import ReaderArgs, train_reader
        c, p = self.cfg, self.p
        model, result = c.reader_model or self.init_reader(resume), {}

        def loop(out: Path, steps: int, batch: int, evals: int = 1) -> LoopArgs:
            return LoopArgs(out_dir=str(out), max_steps=steps, batch_size=batch, lr=c.reader_lr, new_lr=c.reader_new_lr,
                            warmup_steps=max(steps // 10, 1), eval_steps=max(steps // max(evals, 1), 1),
                            save_steps=max(steps // 2, 1), resume=resume, zero_stage=c.reader_zero_stage,
                            **self._reader_frozen(), precision="bf16" if self._reader_bf16() else "auto",
                            seed=LoopArgs.seed + c.seed)

        if c.reader_gold_steps:   # the supervision files read as each question's answer-bearing passage alone
            sup = p["supervision"]
            r = train_reader(ReaderArgs(model, [str(sup / "train.jsonl")], str(sup / "validation.jsonl"), n_passages=1,
                                        text_maxlength=c.text_maxlength, max_validation=c.reader_validation,
                                        span_loss=c.reader_span_loss),
                             loop(p["reader-gold"], c.reader_gold_steps, c.reader_gold_batch, c.reader_gold_evals))
            result["gold_validation_em"] = max(e["em"] for e in r["evals"])   # the checkpoint FiD starts from
            model = str(p["reader-gold"] / "best")
        train_file, val_file = self.reader_data(resume)
        r = train_reader(ReaderArgs(model, [str(train_file)], str(val_file), n_passages=c.reader_k,
                                    text_maxlength=c.text_maxlength, max_validation=c.reader_validation,
                                    span_loss=c.reader_span_loss),
                         loop(p["reader"], c.reader_steps, c.reader_batch))
        return {"train_questions": r["train_questions"], **result,
                "validation_em": r["evals"][-1]["em"] if r["evals"] else None}

    def init_reader(self, resume: bool = False) -> str:
        """The reader to train: bert2bert from the encoder, or a from-scratch T5 (optionally pretrained)."""
        from odqa.reader.args import LoopArgs
        c, p = self.cfg, self.p
        if c.reader_init not in ("warm", "t5"):
            raise InputError(f"reader_init must be warm or t5, not {c.reader_init!r}")
        if not (p["reader-init"] / "config.json").exists():
            if c.reader_init == "warm":
                from odqa.reader.warm_start import init_warm_reader
                init_warm_reader(self.encoder, p["reader-init"], c.reader_decoder_layers, seed=c.seed,
                                 pointer=c.reader_pointer,
                                 passage_prior=c.reader_passage_prior and c.reader_pointer)
            else:
                from odqa.reader.t5_init import init_reader, passage_text
                store = PassageStore(self.corpus)
                init_reader((passage_text(x) for x in store), p["reader-init"], c.reader_preset)
                store.close()
        if c.reader_init == "t5" and c.pretrain_steps:
            from odqa.reader.pretrain import PretrainArgs, pretrain_reader
            pretrain_reader(PretrainArgs(str(p["reader-init"]), str(self.corpus)),
                            LoopArgs(out_dir=str(p["reader-pretrain"]), max_steps=c.pretrain_steps, batch_size=32,
                                     lr=c.reader_lr, warmup_steps=max(c.pretrain_steps // 10, 1),
                                     eval_steps=max(c.pretrain_steps // 3, 1), save_steps=max(c.pretrain_steps // 3, 1),
                                     resume=resume))
            return str(p["reader-pretrain"] / "best")
        return str(p["reader-init"])

    def reader_data(self, resume: bool = False) -> tuple[Path, Path]:
        """The top-k passages of the supervision questions, BM25's or the pipeline's own (`reader_passages`):
        FiD's training and validation files. Validation keeps the first `reader_validation` questions with
        an answer in their top k: the others score 0 with any reader (span decoding answers from the
        passages), and a validation EM over them says little (the demo's used to read 0.0 over 100
        questions, 12 of them answerable)."""
        from odqa.common.retrieval_file import write_results
        from odqa.retriever.retrieve import retrieve, retrieve_phrases
        c, out = self.cfg, self.p["reader-data"]
        if c.reader_passages not in ("bm25", "phrase"):
            raise InputError(f"reader_passages must be bm25 or phrase, not {c.reader_passages!r}")
        paths = [out / f"{c.reader_passages}-{split}.json" for split in ("train", "validation")]
        if resume and all(path.exists() for path in paths):   # each written whole: a resumed stage searches no more
            return paths[0], paths[1]
        out.mkdir(parents=True, exist_ok=True)
        store = None
        if c.reader_passages == "bm25":
            from odqa.retriever.bm25 import BM25Index
            index, store = BM25Index.open(self.corpus), PassageStore(self.corpus)
            search = lambda questions: retrieve(index, store, questions, c.reader_k)  # noqa: E731
        else:   # the searcher reads its passages itself
            searcher = self.searcher()
            search = lambda questions: retrieve_phrases(searcher, questions, c.reader_k)  # noqa: E731
        for path, split, limit in zip(paths, ("train", "validation"), (c.reader_questions, None)):
            entries = search(load_questions(self.p["supervision"] / f"{split}.jsonl", limit=limit))
            if split == "validation":   # none answerable (a tiny corpus): the first ones, validation still runs
                answerable = [e for e in entries if any(ctx["has_answer"] for ctx in e["ctxs"])]
                entries = (answerable or entries)[:c.reader_validation]
            write_results(path, entries)
        if store is not None:
            store.close()
        return paths[0], paths[1]

    def train_reranker(self, resume: bool = False) -> dict:
        """The pipeline's own top `rerank_depth` passages of the training and validation questions (each
        file written whole, so a resumed stage searches no more), then `odqa train-reranker` on them."""
        from odqa.common.retrieval_file import write_results
        from odqa.retriever.args import RerankerTrainArgs
        from odqa.retriever.cross_encoder_train import train_reranker
        from odqa.retriever.retrieve import retrieve_phrases
        c, out = self.cfg, self.p["reranker-data"]
        paths = {split: out / f"{split}.json" for split in ("train", "validation")}
        if not (resume and all(path.exists() for path in paths.values())):
            out.mkdir(parents=True, exist_ok=True)
            searcher = self.searcher()
            for (split, path), limit in zip(paths.items(), (c.reranker_questions, c.reranker_validation)):
                questions = load_questions(self.p["supervision"] / f"{split}.jsonl", limit=limit)
                write_results(path, retrieve_phrases(searcher, questions, c.rerank_depth))
        r = train_reranker(RerankerTrainArgs(
            train_file=str(paths["train"]), validation_file=str(paths["validation"]), out_dir=str(self.p["reranker"]),
            encoder=self.encoder, depth=c.rerank_depth, batch_size=c.reranker_batch,
            # save_steps: a half-hour stage that is interrupted resumes within 100 steps
            max_validation_examples=c.reranker_validation, resume=resume, save_steps=100,
            precision="bf16" if self._reader_bf16() else "auto", seed=RerankerTrainArgs.seed + c.seed))
        best = next(row for row in r["weight_grid"] if row["weight"] == r["weight"])
        metric = f"MRR@{c.rerank_depth}"
        return {"train_questions": r["train_questions"], "steps": r["steps"], "weight": r["weight"],
                "search Top-1": round(r["retriever"]["Top-1"], 2), "reranked Top-1": round(best["Top-1"], 2),
                f"search {metric}": round(r["retriever"][metric], 2), f"reranked {metric}": round(best[metric], 2)}

    def build_memory(self, resume: bool = False) -> dict:
        from odqa.retriever.answer_memory import build_memory
        questions = [q for name in self.cfg.train_questions for q in load_questions(name)]
        return {"questions": build_memory(self.phrase_model(), questions, self.cfg.train_questions,
                                          self.p["memory"])["questions"]}

    def memory(self) -> Path | None:
        return self.p["memory"] if self.cfg.answer_memory else None

    def evaluate(self, resume: bool = False) -> dict:
        from odqa.system.run import RunArgs, run
        c, reranker, memory = self.cfg, self.reranker(), self.memory()
        rows = run(RunArgs(str(self.p["run"]), index=str(self.p["phrase-index"]), model=str(self.phrase_model()),
                           reader=str(self.p["reader"] / "best"), questions=c.test_questions, k=c.run_k, limit=c.run_limit,
                           doc_index=str(self.p["doc-index"]), doc_model=str(self.doc_model()), top_docs=c.top_docs,
                           corpus=str(self.corpus), baselines=c.baselines, text_maxlength=c.text_maxlength,
                           reranker=str(reranker) if reranker else None, rerank_depth=c.rerank_depth,
                           memory=str(memory) if memory else None, no_memory=memory is None))
        return {"rows": len(rows), "examples": self.pick_examples()}

    def pick_examples(self) -> list[dict]:
        """The first questions of the first test set whose answer the retriever found in the top k:
        the cases where both answer kinds have something to work with."""
        first = question_set_name(self.cfg.test_questions[0])
        k = str(max(self.cfg.run_k))
        found = [r for _, r in read_jsonl(self.p["run"] / "questions.jsonl")
                 if r["dataset"] == first and r["k"][k]["hit"]]
        return [{"question": r["question"], "answers": r["answers"]} for r in found[: self.cfg.examples]]
    def pipeline(self) -> tuple[dict[str, Path], dict[str, Path]]:
        """(what the stages have built so far as a pipeline record's parts, the parts an earlier run of
        this recipe recorded that no longer belong). A model and its index go in together, once the index
        is built from that model: between a new phrase model and its index (the next stage, or a run
        stopped there) searches keep the pair recorded before, where the new model beside the old index
        would refuse to search."""
        from odqa.retriever.doc_encoder import doc_encoder_hash
        from odqa.retriever.phrase_model import phrase_encoder_hash, question_encoder_hash
        built = {"corpus": self.corpus, "supervision": self.p["supervision"], "phrase_model": self.phrase_model(),
                 "phrase_index": self.p["phrase-index"],
                 "doc_model": self.doc_model(), "doc_index": self.p["doc-index"], "reader": self.p["reader"] / "best",
                 "reranker": self.reranker()}
        built = {k: v for k, v in built.items() if v and Path(v).exists()}
        for model, index, encoder_hash in (("phrase_model", "phrase_index", phrase_encoder_hash),
                                           ("doc_model", "doc_index", doc_encoder_hash)):
            manifest = Path(built[index]) / "manifest.json" if index in built else None
            if not (model in built and manifest and manifest.is_file()
                    and read_json(manifest).get("encoder_hash") == encoder_hash(built[model])):
                built.pop(model, None)
                built.pop(index, None)
        # The memory goes with the model whose question encoders built it; until the memory stage has
        # encoded them for a new model (or without the stage), this recipe's memory leaves the pipeline.
        memory = read_manifest(self.p["memory"]) if self.cfg.answer_memory else None
        if memory and "phrase_model" in built and \
                memory.get("key", {}).get("question_encoder") == question_encoder_hash(built["phrase_model"]):
            built["memory"] = self.p["memory"]
        # Without the reranker stage, its own earlier reranker goes (trained on the passages of models it
        # may have replaced); one trained by hand stays.
        forget = {} if self.cfg.reranker else {"reranker": self.p["reranker"] / "best"}
        return built, forget if "memory" in built else {**forget, "memory": self.p["memory"]}

    def settings(self) -> dict:
        """The search and reading settings the recipe's run evaluates with, which its pipeline record
        keeps so that `odqa ask` and `odqa.load` answer as the report was made."""
        c = self.cfg
        return {"top_docs": c.top_docs, "rerank_depth": c.rerank_depth, "text_maxlength": c.text_maxlength}


def ensure_corpus(inputs: list[Path], out_dir: Path, max_words: int = 100) -> dict:
    """The built corpus in out_dir, rebuilt only if it was built from other inputs or settings."""
    info_path = out_dir / "corpus.json"
    if info_path.exists():
        info = read_json(info_path)
        if info.get("inputs") == [str(p.resolve()) for p in inputs] and info.get("max_words") == max_words:
            log.info("corpus already built at %s (%d passages); reusing it", out_dir, info["passages"])
            return info
    return build_corpus(inputs, out_dir, max_words=max_words)


