"""A recipe's stages, usable one by one from Python and run in order by `odqa demo` (system/demo.py):

    data       fetch the data pack (or take `documents`); build passages and documents; BM25 index
    supervise  answer-bearing passages for the training questions (NQ-dev, TQA-dev)
    phrase     train the phrase and question encoders (retriever.phrase_train); where phrase_round_lrs
               names more rounds, each is one epoch on a fresh schedule from the round before's best
    index      dump every passage's phrase vectors; the phrase filter; faiss phrase index
    query      query-side fine-tuning of the question encoders against that index (DensePhrases Eq. 11),
               query_rounds rounds of query.epochs; a stage only where query_rounds > 0 (the full preset)
    doc        train the document encoder (DHR), one or two rounds; document index; tune lambda
    refit      (query_final_fit, the full preset) the query rounds again, on the training and validation
               questions both, once validation has tuned lambda with the rounds that did not see it
    reader     a bert2bert warm-started from the encoder, or a T5 (SentencePiece + preset, or any
               checkpoint, optional span-corruption pretraining); the gold passage alone, then FiD on
               the training questions' BM25 passages or the pipeline's own (DeepSpeed or accelerate)
    reranker   (opt-in: `with_reranker`) a cross-encoder passage reranker trained on the pipeline's top
               `reranker.rerank_depth` passages of the training questions; `run` and `ask` then read through it
    memory     (`answer_memory`, on by default) the training question sets encoded by the search model's
               question encoders: `run` and `ask` let a question's nearest ones vote for their answers
    run        `odqa run` on a slice of NQ-test and TQA-test: the report table

    r = Recipe(preset_config("full"), "runs/mine")       # every stage writes under runs/mine
    r.build_data(); r.supervise(); r.train_phrase(); r.build_phrase_index(); ...
    r.stages()                                            # the schedule: each stage, what its key is made of

Each verb is one stage: it reads what the stages before it wrote in the run directory (`p`), sets the
files of its section's trainer settings (the section holds the settings, the recipe places the files),
and with `resume` goes on from its own checkpoints.
"""
from __future__ import annotations

import dataclasses
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
from odqa.common.settings import flat, updated
from odqa.retriever.search_config import ANSWER_FILTER_RULES
from odqa.system.estimate import Estimates
from odqa.system.recipe_config import RecipeConfig

log = logging.getLogger(__name__)


class Stage:
    """One stage: what it does, its estimate, its function (`fn(resume)`), what its key is made of
    (`uses`: the recipe's fields and sections whose settings make its outputs, as "section" or
    "section.subsection"; `versions`: the code's own, where a rule changed what it makes), what it
    writes and what it removes before it starts over."""

    def __init__(self, name: str, what: str, estimate_s: float, fn: Callable[[bool], dict], uses: tuple[str, ...],
                 outputs: list[Path], clean: list[Path] = (), versions: dict | None = None):
        self.name, self.what, self.estimate_s, self.fn = name, what, estimate_s, fn
        self.uses, self.versions = uses, dict(versions or {})
        self.outputs, self.clean = outputs, list(clean)
        self.settings: dict = {}   # the key's settings, filled by `Recipe.stages` (`settings_of_uses`)
        self.defaults: dict = {}   # the same of the sections' own classes, as a key written before a setting was added reads


def settings_of_uses(cfg, uses: tuple[str, ...]) -> dict:
    """The settings of each of `uses` in `cfg`: a section's as a dict (`dataclasses.asdict`), a field's
    value."""
    out = {}
    for name in uses:
        value = cfg
        for part in name.split("."):
            value = getattr(value, part)
        out[name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    return out


def class_defaults(uses: tuple[str, ...]) -> dict:
    """`settings_of_uses` of every section's own class default (not the recipe's values), for what a
    stage record written before a setting was added did not name."""
    out = {}
    for name in uses:
        cls, field = RecipeConfig, None
        for part in name.split("."):
            field = next(f for f in dataclasses.fields(cls) if f.name == part)
            cls = field.metadata.get("section")
        out[name] = dataclasses.asdict(cls()) if cls is not None else (
            field.default_factory() if field.default is dataclasses.MISSING else field.default)
    return out


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
        query_uses = ("query", "query_rounds", "seed")
        stages = [
            Stage("data", "fetch the data pack, build passages and documents, BM25 index", e.data(),
                  self.build_data, ("documents", "corpus"), [self.corpus / "bm25"]),
            Stage("supervise", "distant supervision: answer-bearing passages of the training questions",
                  e.supervise(), self.supervise, ("supervise",),
                  [p["supervision"] / "train.jsonl"], [p["supervision"]]),
            Stage("phrase", f"train the phrase encoder ({e.phrase_steps} steps of {c.phrase.batch_size}{phrase_rounds})",
                  e.phrase(), self.train_phrase, ("encoder", "phrase", "phrase_round_lrs", "seed"),
                  [self.phrase_checkpoint()], self.phrase_rounds()),
            Stage("index", f"dump the phrase vectors of {n_pass:,} passages, "
                           + (f"fit the phrase filter, keep {c.index.keep:.0%}, " if c.index.keep < 1 else "")
                           + f"{c.index.factory or 'OPQ + IVF-PQ'} index",
                  e.index(), self.build_phrase_index, ("filter", "index", "seed"),
                  [p["phrase-index"]], [p["phrase-dump"], p["phrase-index"]],
                  # the default's kind: a run made under an older default is rebuilt
                  versions={"default_factory": "OPQ,IVF,PQ"}),
            *([Stage("query", f"query-side fine-tuning against the index ({c.query_rounds * c.query.epochs} epochs "
                              f"of {e.query_questions:,} questions"
                              + (f", {c.query_rounds} rounds)" if c.query_rounds > 1 else ")"),
                     e.query(), self.tune_query, query_uses,
                     # the final fit's rounds go too: they came from this stage's settings
                     [], self.query_rounds() + self.query_rounds(final=True))]
              if c.query_rounds else []),
            Stage("doc", f"train the document encoder ({e.doc_steps} steps), index {n_docs:,} documents, tune lambda",
                  e.doc(), self.train_doc, ("doc", "doc_rounds", "tune_lambda", "search.prefilter", "seed"),
                  [self.doc_model(), p["doc-index"]], [p["doc-r1"], p["doc-r2"], p["doc-index"]]),
            *([Stage("refit", "the query rounds again, on the training and validation questions",
                     e.refit(), self.refit_query, query_uses,
                     [], self.query_rounds(final=True) + [p["query-final-data"]])]
              if c.query_rounds and c.query_final_fit else []),
            Stage("reader", f"train the FiD reader ({self._reader_plan()})", e.reader(), self.train_reader,
                  ("reader_model", "reader_kind", "reader_init", "reader", "reader_loop", "reader_passages",
                   "reader_questions", "reader_bf16", "pretrain_steps", "gold_steps", "gold_batch", "gold_evals",
                   "encoder", "seed"),
                  [p["reader"] / "best"],
                  [p["reader-init"], p["reader-pretrain"], p["reader-data"], p["reader-gold"], p["reader"]]),
            # After the reader, so that turning it on or off reruns the run stage only.
            *([Stage("reranker", f"train the passage reranker on the top {c.reranker.rerank_depth} passages of "
                                 f"{e.rerank_questions:,} training questions",
                     e.reranker(), self.train_reranker, ("encoder", "reranker", "seed"),
                     [p["reranker"] / "best"], [p["reranker-data"], p["reranker"]])]
              if c.with_reranker else []),
            # Before the run, after the reader: turning it on or off reruns the run stage only.
            *([Stage("memory", f"the answer memory: the questions of {', '.join(c.supervise.questions)}, encoded by "
                               f"the search model", e.memory(),
                     self.build_memory, ("supervise",), [p["memory"]], [p["memory"]])]
              if c.answer_memory else []),
            Stage("run", f"`odqa run` on {c.run.limit or 'all'} questions of {', '.join(c.run.questions)}, "
                         f"k = {', '.join(map(str, c.run.k))}",
                  e.run(), self.evaluate, ("run", "search", "reading", "examples"), [p["run"] / "report.json"],
                  [p["run"]],
                  # the extractive answer's filter rules and the report's columns (2: F1, and the memory's
                  # answer in a column of its own): a run made under older ones is made again
                  versions={"answer_filter": ANSWER_FILTER_RULES, "report": 2}),
        ]
        from odqa.system.legacy import old_stage_settings, to_old
        old = to_old(c)
        legacy = old_stage_settings(old, self.corpus) if old is not None else {}
        for s in stages:
            s.settings = {**settings_of_uses(c, s.uses), **s.versions}
            s.defaults = {**class_defaults(s.uses), **s.versions}
            s.legacy = legacy.get(s.name)   # 0.1's key of the same stage, where 0.1 could say this recipe
        return stages

    def _reader_plan(self) -> str:
        c = self.cfg
        parts = [f"{c.pretrain_steps} pretraining"] if c.reader_kind == "t5" and c.pretrain_steps else []
        if c.gold_steps:
            parts.append(f"{c.gold_steps} gold-passage steps")
        return " + ".join(parts + [f"{c.reader_loop.max_steps} FiD steps, k={c.reader.k}"])

    def _reader_bf16(self) -> bool:
        from odqa.common.device import cpu_has_bf16
        return self.cfg.reader_bf16 and cpu_has_bf16()

    def _reader_frozen(self) -> dict:
        """What the reader's training holds fixed: nothing for a from-scratch T5, whose embeddings are
        random and must learn."""
        c = self.cfg
        if c.reader_kind == "t5" and not c.reader_model:
            return {"freeze_embeddings": False, "freeze_layers": 0}
        return {"freeze_embeddings": c.reader_loop.freeze_embeddings, "freeze_layers": c.reader_loop.freeze_layers}

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
        limit = split_limit(name, self.cfg.run.limit)[1]
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
        sup = self.cfg.supervise
        stats = supervise(sup.questions, self.corpus, self.p["supervision"], positives_per_question=sup.positives,
                          validation_percent=sup.validation_percent)
        return stats["examples"]

    def _supervision(self, section):
        """`section` (a trainer's settings) on this recipe's supervision files."""
        sup = self.p["supervision"]
        return replace(section, train_file=str(sup / "train.jsonl"), validation_file=str(sup / "validation.jsonl"))

    def train_phrase(self, resume: bool = False) -> dict:
        """Round 1 from the encoder; each further round one more epoch from the round before's best on a
        fresh schedule (docs/notes/retrieval.md: the second epoch so run reads the gold passage 31.25 against 25.75)."""
        from odqa.retriever.phrase_train import train
        c = self.cfg
        rounds = self.phrase_rounds()
        args = updated(self._supervision(c.phrase), out_dir=str(rounds[0]), encoder=self.encoder, resume=resume,
                       seed=c.phrase.seed + c.seed)
        r = train(args)
        result = {"validation_em": [r["best_em"]], "steps": r["steps"]}
        for lr, out in zip(c.phrase_round_lrs, rounds[1:]):
            args = updated(args, encoder=str(Path(args.out_dir) / "best"), out_dir=str(out), epochs=1, lr=lr,
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
        from odqa.retriever.index_build import build_index
        from odqa.retriever.phrase_dump import dump_phrases
        c, sup = self.cfg, self.p["supervision"]
        d = dump_phrases(self.phrase_checkpoint(), self.corpus, self.p["phrase-dump"])
        result = {"dumped_per_passage": round(d["vectors_per_passage"], 1)}
        if c.index.keep < 1:
            from odqa.retriever.phrase_filter import train_filter
            table = train_filter(replace(c.filter, dump=self.p["phrase-dump"], train_file=sup / "train.jsonl",
                                         validation_file=sup / "validation.jsonl", corpus=self.corpus,
                                         seed=c.filter.seed + c.seed))
            kept = [row["answer_recall"] for row in table["calibration"] if row["keep"] == c.index.keep]
            if kept:
                result["answer_phrases_kept"] = round(100 * kept[0], 1)
        m = build_index(replace(c.index, dump=self.p["phrase-dump"], out=self.p["phrase-index"], corpus=self.corpus,
                                seed=c.index.seed + c.seed))
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
        from odqa.retriever.query_train import NoPositives, train_query
        c = self.cfg
        args = replace(c.query, model=str(self.phrase_checkpoint()), index=str(self.p["phrase-index"]),
                       corpus=str(self.corpus), out_dir=str(rounds[0]), questions=str(questions), resume=resume,
                       seed=c.query.seed + c.seed)
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
        if self.cfg.query_rounds:
            rounds = self.query_rounds() + (self.query_rounds(final=True) if final and self.cfg.query_final_fit else [])
            for out in reversed(rounds):
                if is_phrase_checkpoint(out / "last"):
                    return out / "last"
        return self.phrase_checkpoint()

    def train_doc(self, resume: bool = False) -> dict:
        from odqa.retriever.doc_index import build_doc_index
        from odqa.retriever.doc_train import train_doc
        c = self.cfg
        base = updated(self._supervision(c.doc), corpus=str(self.corpus), out_dir=str(self.p["doc-r1"]),
                       encoder=self.encoder, resume=resume, seed=c.doc.seed + c.seed)
        result = {"round 1 Top-20": train_doc(base)["best_top20"]}
        model = self.p["doc-r1"] / "best"
        if c.doc_rounds > 1:
            r2 = train_doc(updated(base, out_dir=str(self.p["doc-r2"]), encoder=str(model), negatives="model"))
            result["round 2 Top-20"] = r2["best_top20"]
            model = self.p["doc-r2"] / "best"
        build_doc_index(model, self.corpus, self.p["doc-index"])
        from odqa.retriever.tune_lambda import tune_searcher_lambda
        tuned = tune_searcher_lambda(self.searcher(final=False),
                                     load_questions(self.p["supervision"] / "validation.jsonl"), c.tune_lambda)
        return {**result, "lambda": tuned["lambda"], "bm25_weight": tuned["bm25_weight"]}

    def doc_model(self) -> Path:
        return (self.p["doc-r2"] if self.cfg.doc_rounds > 1 else self.p["doc-r1"]) / "best"

    def parts(self, reranked: bool = False, final: bool = True, memory: bool = False, reader: bool = False):
        """The pipeline's parts as this recipe places them: its phrase index and model behind its
        pre-filter; with `reranked`, behind the reranker too where this recipe trains one; with `memory`,
        consulting the answer memory where it builds one; with `reader`, the reader it trains;
        `final=False`: with the query rounds that did not see validation."""
        from odqa.system.args import PipelineParts
        rerank, mem = self.reranker() if reranked else None, self.memory() if memory else None
        return PipelineParts(index=str(self.p["phrase-index"]), model=str(self.phrase_model(final)),
                             doc_index=str(self.p["doc-index"]), doc_model=str(self.doc_model()),
                             corpus=str(self.corpus), reranker=str(rerank) if rerank else None,
                             memory=str(mem) if mem else None, no_memory=mem is None,
                             reader=str(self.p["reader"] / "best") if reader else None)

    def searcher(self, reranked: bool = False, final: bool = True, memory: bool = False):
        """The pipeline's searcher (`parts`), searching by the recipe's search settings."""
        from odqa.system.pipeline import assemble
        return assemble(self.parts(reranked, final, memory), self.cfg.search, self.cfg.reading, record=None,
                        reader=False).searcher

    def reranker(self) -> Path | None:
        return self.p["reranker"] / "best" if self.cfg.with_reranker else None

    def train_reader(self, resume: bool = False) -> dict:
        from odqa.reader.fid_train import train_reader
        c, p = self.cfg, self.p
        model, result = c.reader_model or self.init_reader(resume), {}

        def loop(out: Path, steps: int, batch: int, evals: int = 1):
            return replace(c.reader_loop, out_dir=str(out), max_steps=steps, batch_size=batch,
                           warmup_steps=max(steps // 10, 1), eval_steps=max(steps // max(evals, 1), 1),
                           save_steps=max(steps // 2, 1), resume=resume, **self._reader_frozen(),
                           precision="bf16" if self._reader_bf16() else c.reader_loop.precision,
                           seed=c.reader_loop.seed + c.seed)

        if c.gold_steps:   # the supervision files read as each question's answer-bearing passage alone
            sup = p["supervision"]
            r = train_reader(replace(c.reader, model=model, train_file=[str(sup / "train.jsonl")],
                                     validation_file=str(sup / "validation.jsonl"), k=1),
                             loop(p["reader-gold"], c.gold_steps, c.gold_batch, c.gold_evals))
            result["gold_validation_em"] = max(e["em"] for e in r["evals"])   # the checkpoint FiD starts from
            model = str(p["reader-gold"] / "best")
        train_file, val_file = self.reader_data(resume)
        r = train_reader(replace(c.reader, model=model, train_file=[str(train_file)], validation_file=str(val_file)),
                         loop(p["reader"], c.reader_loop.max_steps, c.reader_loop.batch_size))
        return {"train_questions": r["train_questions"], **result,
                "validation_em": r["evals"][-1]["em"] if r["evals"] else None}

    def init_reader(self, resume: bool = False) -> str:
        """The reader to train: bert2bert from the encoder, or a from-scratch T5 (optionally pretrained)."""
        from odqa.reader.args import LoopArgs, PretrainArgs
        c, p = self.cfg, self.p
        init = c.reader_init
        if not (p["reader-init"] / "config.json").exists():
            # the recipe's seed moves the new weights' seed as it moves every trainer's
            settings = replace(init, seed=init.seed + c.seed, passage_prior=init.passage_prior and init.pointer)
            if c.reader_kind == "warm":
                from odqa.reader.warm_start import init_warm_reader
                init_warm_reader(self.encoder, p["reader-init"], settings)
            else:
                from odqa.reader.t5_init import init_reader, passage_text
                store = PassageStore(self.corpus)
                init_reader((passage_text(x) for x in store), p["reader-init"], settings)
                store.close()
        if c.reader_kind == "t5" and c.pretrain_steps:
            from odqa.reader.pretrain import pretrain_reader
            steps = c.pretrain_steps
            pretrain_reader(PretrainArgs(model=str(p["reader-init"]), corpus=str(self.corpus)),
                            LoopArgs(out_dir=str(p["reader-pretrain"]), max_steps=steps, batch_size=32,
                                     lr=c.reader_loop.lr, warmup_steps=max(steps // 10, 1),
                                     eval_steps=max(steps // 3, 1), save_steps=max(steps // 3, 1), resume=resume,
                                     seed=c.reader_loop.seed + c.seed))
            return str(p["reader-pretrain"] / "best")
        return str(p["reader-init"])

    def reader_data(self, resume: bool = False) -> tuple[Path, Path]:
        """The top-k passages of the supervision questions, BM25's or the pipeline's own (`reader_passages`):
        FiD's training and validation files. Validation keeps the first `reader.max_validation_examples`
        questions with an answer in their top k: the others score 0 with any reader (span decoding
        answers from the passages), and a validation EM over them says little (the demo's used to read
        0.0 over 100 questions, 12 of them answerable)."""
        from odqa.common.retrieval_file import write_results
        from odqa.retriever.retrieve import retrieve, retrieve_phrases
        c, out, k = self.cfg, self.p["reader-data"], self.cfg.reader.k
        paths = [out / f"{c.reader_passages}-{split}.json" for split in ("train", "validation")]
        if resume and all(path.exists() for path in paths):   # each written whole: a resumed stage searches no more
            return paths[0], paths[1]
        out.mkdir(parents=True, exist_ok=True)
        store = None
        if c.reader_passages == "bm25":
            from odqa.retriever.bm25 import BM25Index
            index, store = BM25Index.open(self.corpus), PassageStore(self.corpus)
            search = lambda questions: retrieve(index, store, questions, k)  # noqa: E731
        else:   # the searcher reads its passages itself
            searcher = self.searcher()
            search = lambda questions: retrieve_phrases(searcher, questions, k)  # noqa: E731
        for path, split, limit in zip(paths, ("train", "validation"), (c.reader_questions, None)):
            entries = search(load_questions(self.p["supervision"] / f"{split}.jsonl", limit=limit))
            if split == "validation":   # none answerable (a tiny corpus): the first ones, validation still runs
                answerable = [e for e in entries if any(ctx["has_answer"] for ctx in e["ctxs"])]
                entries = (answerable or entries)[:c.reader.max_validation_examples]
            write_results(path, entries)
        if store is not None:
            store.close()
        return paths[0], paths[1]

    def train_reranker(self, resume: bool = False) -> dict:
        """The pipeline's own top `reranker.rerank_depth` passages of the training and validation questions
        (each file written whole, so a resumed stage searches no more), then `odqa train-reranker` on them."""
        from odqa.common.retrieval_file import write_results
        from odqa.retriever.cross_encoder_train import train_reranker
        from odqa.retriever.retrieve import retrieve_phrases
        c, out, section = self.cfg, self.p["reranker-data"], self.cfg.reranker
        paths = {split: out / f"{split}.json" for split in ("train", "validation")}
        if not (resume and all(path.exists() for path in paths.values())):
            out.mkdir(parents=True, exist_ok=True)
            searcher = self.searcher()
            for (split, path), limit in zip(paths.items(), (section.max_train_examples,
                                                            section.max_validation_examples)):
                questions = load_questions(self.p["supervision"] / f"{split}.jsonl", limit=limit)
                write_results(path, retrieve_phrases(searcher, questions, section.rerank_depth))
        r = train_reranker(replace(
            section, train_file=str(paths["train"]), validation_file=str(paths["validation"]),
            out_dir=str(self.p["reranker"]), encoder=self.encoder, resume=resume,
            precision="bf16" if self._reader_bf16() else section.precision, seed=section.seed + c.seed))
        best = next(row for row in r["weight_grid"] if row["weight"] == r["weight"])
        metric = f"MRR@{section.rerank_depth}"
        return {"train_questions": r["train_questions"], "steps": r["steps"], "weight": r["weight"],
                "search Top-1": round(r["retriever"]["Top-1"], 2), "reranked Top-1": round(best["Top-1"], 2),
                f"search {metric}": round(r["retriever"][metric], 2), f"reranked {metric}": round(best[metric], 2)}

    def build_memory(self, resume: bool = False) -> dict:
        from odqa.retriever.answer_memory import build_memory
        names = self.cfg.supervise.questions
        questions = [q for name in names for q in load_questions(name)]
        return {"questions": build_memory(self.phrase_model(), questions, names, self.p["memory"])["questions"]}

    def memory(self) -> Path | None:
        return self.p["memory"] if self.cfg.answer_memory else None

    def evaluate(self, resume: bool = False) -> dict:
        from odqa.system.args import RunArgs
        from odqa.system.run import run
        c = self.cfg
        rows = run(RunArgs(out_dir=str(self.p["run"]), parts=self.parts(reranked=True, memory=True, reader=True),
                           search=c.search, reading=c.reading, evaluation=c.run))
        return {"rows": len(rows), "examples": self.pick_examples()}

    def pick_examples(self) -> list[dict]:
        """The first questions of the first test set whose answer the retriever found in the top k:
        the cases where both answer kinds have something to work with."""
        first = question_set_name(self.cfg.run.questions[0])
        k = str(max(self.cfg.run.k))
        found = [r for _, r in read_jsonl(self.p["run"] / "questions.jsonl")
                 if r["dataset"] == first and r["k"][k]["hit"]]
        return [{"question": r["question"], "answers": r["answers"]} for r in found[: self.cfg.examples]]

    def recorded_parts(self) -> tuple[dict[str, Path], dict[str, Path]]:
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
        forget = {} if self.cfg.with_reranker else {"reranker": self.p["reranker"] / "best"}
        return built, forget if "memory" in built else {**forget, "memory": self.p["memory"]}

    def settings(self) -> dict:
        """The search and reading settings the recipe's run evaluates with, by flat name, which its
        pipeline record keeps so that `odqa ask` and `odqa.load` answer as the report was made."""
        return {**flat(self.cfg.search), **flat(self.cfg.reading)}


def ensure_corpus(inputs: list[Path], out_dir: Path, max_words: int = 100) -> dict:
    """The built corpus in out_dir, rebuilt only if it was built from other inputs or settings."""
    info_path = out_dir / "corpus.json"
    if info_path.exists():
        info = read_json(info_path)
        if info.get("inputs") == [str(p.resolve()) for p in inputs] and info.get("max_words") == max_words:
            log.info("corpus already built at %s (%d passages); reusing it", out_dir, info["passages"])
            return info
    return build_corpus(inputs, out_dir, max_words=max_words)


