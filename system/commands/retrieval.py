"""The retrievers' commands: `retrieve`, `train-teacher`, `train-phrase`, `dump-phrases`, `train-filter`,
`build-index`, `train-query`, `train-doc`, `build-doc-index`, `tune-lambda`, `train-reranker` and `verify`; and the flags
that name a phrase index behind its optional document pre-filter, which `ask`, `serve` and `run` share."""
from __future__ import annotations

import argparse
from pathlib import Path

from odqa.common.io import InputError
from odqa.retriever.args import (
    BuildIndexArgs,
    DocIndexArgs,
    DocTrainArgs,
    DumpArgs,
    FilterArgs,
    MemoryArgs,
    PhraseTrainArgs,
    QueryTrainArgs,
    RerankerTrainArgs,
    RetrieveArgs,
    TeacherTrainArgs,
    TuneLambdaArgs,
    VerifyArgs,
)
from odqa.retriever.search_config import SearchConfig
from odqa.system.commands.args import (
    add_dataclass_args,
    command,
    config_arg,
    dataclass_from_args,
    given,
    stage_key,
)


def pipeline_of(args, reader: bool = False, **parts):
    """The `Pipeline` of a command's parsed flags (`odqa.system.pipeline.assemble`): the parts its flags
    name and the default pipeline's for the others, the record's settings under the settings flags
    given; `parts` changes the parts named (`no_reranker=True`). Nothing is loaded until it is used."""
    from odqa.reader.args import ReaderSettings
    from odqa.system.args import PipelineParts, SearchParts
    from odqa.system.pipeline import assemble
    named = dataclass_from_args(PipelineParts if reader else SearchParts, args)
    named = PipelineParts(**{**{k: getattr(named, k) for k in vars(named)}, **parts})
    overrides = {**given(SearchConfig, args), **(given(ReaderSettings, args) if reader else {})}
    return assemble(named, overrides=overrides, reader=reader)


def search_args(p: argparse.ArgumentParser, reader: bool = False) -> None:
    """The flags of a pipeline's parts (`SearchParts`, or `PipelineParts` with `reader`) and of every
    search setting, each unset unless given, so that the default pipeline's record can fill it."""
    from odqa.system.args import PipelineParts, SearchParts
    add_dataclass_args(p, PipelineParts if reader else SearchParts)
    add_dataclass_args(p, SearchConfig, unset=True)


def cmd_retrieve(args) -> None:
    from odqa.common.corpus import PassageStore
    from odqa.common.paths import default_corpus
    from odqa.common.questions import load_questions
    from odqa.common.ranks import current, parts_beside
    from odqa.common.retrieval_file import write_results, write_trec
    from odqa.retriever.args import BM25Params
    from odqa.retriever.bm25 import BM25Index
    from odqa.retriever.retrieve import retrieve, retrieve_phrases
    if args.passage_model and args.retriever != "dense":
        raise InputError(f"--passage-model is DPR's context encoder, for --retriever dense, not {args.retriever}")
    if args.retriever == "phrase":
        pipeline = pipeline_of(args)   # a missing part is named before any question is read
    elif args.reranker:
        raise InputError(f"--reranker reorders the phrase retriever's passages, not {args.retriever}'s")
    elif args.memory:
        raise InputError(f"--memory lends answers to the phrase retriever's vote, not to {args.retriever}'s")
    corpus = args.corpus or default_corpus()
    questions = load_questions(args.questions, limit=args.limit)
    # Under a launcher each rank searches its share of the questions; a killed run resumes its batches.
    split = {"parts": parts_beside(args.out), "key": stage_key(args)}
    if args.retriever == "phrase":
        entries = retrieve_phrases(pipeline.searcher, questions, args.k, args.batch_size, **split)
    else:
        store = PassageStore(corpus)
        if args.retriever == "bm25":
            params = dataclass_from_args(BM25Params, args)
            index = BM25Index.open(corpus, params)
        else:
            from odqa.common.paths import default_encoder
            from odqa.retriever.dense import DenseIndex
            if args.passage_model and not args.model:
                raise InputError("--passage-model is DPR's context encoder: --model names its question encoder")
            index = DenseIndex.open(corpus, str(args.model or default_encoder()), args.passage_model)
        entries = retrieve(index, store, questions, args.k, batch_size=args.batch_size, **split)
    if current().main:
        if args.format == "trec":
            write_trec(args.out, entries, tag=f"odqa-{args.retriever}")
        else:
            write_results(args.out, entries)
        print(f"{len(entries)} questions x top-{args.k} passages -> {args.out}"
              + (f" ({params.describe()})" if args.retriever == "bm25" else ""))


def cmd_train_teacher(args) -> None:
    from odqa.retriever.teacher_train import train
    result = train(dataclass_from_args(TeacherTrainArgs, args))
    print(f"validation EM by evaluation: {', '.join(f'{x:.2f}' for x in result['validation_em'])}; "
          f"best {result['best_em']:.2f}; {result['steps']} steps; best checkpoint: {args.out_dir}/best")


def cmd_train_phrase(args) -> None:
    from odqa.retriever.phrase_train import train
    result = train(dataclass_from_args(PhraseTrainArgs, args))
    print(f"validation EM by epoch: {', '.join(f'{x:.2f}' for x in result['validation_em'])}; "
          f"best {result['best_em']:.2f}; {result['steps']} steps; best checkpoint: {args.out_dir}/best")


def cmd_dump_phrases(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.common.ranks import current
    from odqa.retriever.phrase_dump import dump_phrases
    ranks = current()
    if ranks.world > 1 and args.shard is not None:
        raise InputError(f"--shard {args.shard} under a launcher of {ranks.world} ranks: each rank dumps its own "
                         "slice; --shard is for processes started one by one")
    shard = args.shard or f"{ranks.rank + 1}/{ranks.world}"
    summary = dump_phrases(args.model, args.corpus or default_corpus(), args.out, shard=shard,
                           batch_size=args.batch_size, chunk_passages=args.chunk_passages, threshold=args.threshold)
    print(f"shard {shard}: {summary['vectors']} vectors for {summary['passages']} passages "
          f"({summary['vectors_per_passage']:.1f} per passage) -> {args.out}")


def cmd_train_filter(args) -> None:
    from odqa.retriever.phrase_filter import filter_dir, train_filter
    info = train_filter(dataclass_from_args(FilterArgs, args))
    print(f"{info['train_tokens']:,} training tokens; answer phrases kept on {info['validation_answerable']} "
          f"validation passages:")
    print("| tokens kept | score threshold | answer phrases kept |")
    print("|---:|---:|---:|")
    for row in info["calibration"]:
        print(f"| {100 * row['keep']:.0f}% | {row['threshold']:.3f} | {100 * row['answer_recall']:.1f}% |")
    print(f"phrase filter -> {args.out or filter_dir(args.dump)}")


def cmd_build_index(args) -> None:
    from odqa.common.ranks import current
    from odqa.retriever.index_build import build_index
    m = build_index(dataclass_from_args(BuildIndexArgs, args))
    if current().main:   # under a launcher, once
        print(f"{m['factory']} index of {m['vectors']} vectors ({m['vectors_per_passage']:.1f} per passage), "
              f"{sum(m['bytes'].values()) / 2**20:.1f} MiB, {m['bytes_per_passage']:,.0f} bytes per passage -> {args.out}")


def cmd_train_query(args) -> None:
    from odqa.retriever.query_train import train_query
    result = train_query(dataclass_from_args(QueryTrainArgs, args))
    for h in result["history"]:
        print(f"epoch {h['epoch']}: {h['questions']} questions with a positive, loss {h['loss']:.4f}")
    print(f"query-tuned model -> {args.out_dir}/last")


def cmd_train_doc(args) -> None:
    from odqa.retriever.doc_train import train_doc
    r = train_doc(dataclass_from_args(DocTrainArgs, args))
    print(f"{r['train_questions']} questions ({r['with_negatives']} with {args.negatives} negatives), {r['steps']} steps")
    for epoch, m in enumerate(r["validation"], 1):
        print(f"epoch {epoch}: validation document "
              + ", ".join(f"{k} {m[k]:.1f}" for k in ("Top-1", "Top-5", "Top-20", "Top-100")))
    print(f"best Top-20 {r['best_top20']:.1f}; best checkpoint: {args.out_dir}/best")


def cmd_train_reranker(args) -> None:
    from odqa.retriever.cross_encoder_train import train_reranker
    r = train_reranker(dataclass_from_args(RerankerTrainArgs, args))
    print(f"{r['train_questions']} training questions with both kinds of passage in their top {args.rerank_depth}, "
          f"{r['steps']} steps")
    metrics = [k for k in r["retriever"] if k != "questions"]
    print("| validation | " + " | ".join(metrics) + " |")
    print("|---|" + "---:|" * len(metrics))
    print("| the search's order | " + " | ".join(f"{r['retriever'][k]:.1f}" for k in metrics) + " |")
    for e in r["validation"]:
        print(f"| reranker, step {e['step']} | " + " | ".join(f"{e[k]:.1f}" for k in metrics) + " |")
    for row in r["weight_grid"]:
        print(f"| search + {row['weight']:g} x reranker | " + " | ".join(f"{row[k]:.1f}" for k in metrics) + " |")
    print(f"weight {r['weight']:g}; best checkpoint: {args.out_dir}/best")
    if args.record:
        from odqa.common.defaults import pipeline_file, record_pipeline
        record_pipeline({"reranker": Path(args.out_dir) / "best"}, by="odqa train-reranker")
        print(f"the default pipeline's reranker now ({pipeline_file()}); --no-reranker searches without it")


def cmd_build_doc_index(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.common.ranks import current
    from odqa.retriever.doc_index import build_doc_index
    m = build_doc_index(args.model, args.corpus or default_corpus(), args.out, factory=args.factory)
    if current().main:   # under a launcher, once
        print(f"{m['factory']} index of {m['documents']} documents ({m['dim']} dims) -> {args.out}")


def cmd_tune_lambda(args) -> None:
    from odqa.common.questions import load_questions
    from odqa.retriever.tune_lambda import tune_searcher_lambda
    if args.reranker:
        raise InputError("tune-lambda tunes the search's own rerank, which comes before the passage reranker: "
                         "--reranker has no effect here (the reranker's weight is tuned by train-reranker)")
    if args.memory:
        raise InputError("tune-lambda tunes the order of the passages, which the answer memory does not move: "
                         "--memory has no effect here")
    pipeline = pipeline_of(args, no_reranker=True, no_memory=True)
    searcher = pipeline.searcher
    if searcher.prefilter is None:
        raise InputError("tune-lambda needs a document pre-filter (--doc-index and --doc-model, or the default "
                         "pipeline's): lambda weighs the document score")
    result = tune_searcher_lambda(searcher, load_questions(args.questions), dataclass_from_args(TuneLambdaArgs, args),
                                  info={"questions_file": str(args.questions)})
    metric = f"Top-{args.metric_k}"
    table = {(g["lambda"], g["bm25_weight"]): g[metric] for g in result["grid"]}
    lams, mus = sorted({lam for lam, _ in table}), sorted({mu for _, mu in table})
    print(f"| {metric}: lambda \\ BM25 weight | " + " | ".join(f"{mu:g}" for mu in mus) + " |")
    print("|---:|" + "---:|" * len(mus))
    for lam in lams:
        print(f"| {lam:.1f} | " + " | ".join(f"{table[lam, mu]:.2f}" for mu in mus) + " |")
    print(f"best lambda {result['lambda']:.1f}, BM25 weight {result['bm25_weight']:g} ({metric} {result['best']:.2f} "
          f"on {result['questions']} questions) -> {pipeline.parts.doc_index}/lambda.json")


def cmd_build_memory(args) -> None:
    from odqa.common.defaults import default_path, default_pipeline, record_pipeline
    from odqa.common.paths import odqa_home
    from odqa.common.questions import load_questions
    from odqa.retriever.answer_memory import build_memory
    pipeline = default_pipeline()
    model = args.model or default_path("phrase_model", pipeline)
    out = args.out or odqa_home() / "memory"
    questions = [q for name in args.questions for q in load_questions(name)]
    m = build_memory(model, questions, args.questions, out)
    print(f"{m['questions']} questions of {', '.join(args.questions)} ({m['dim']} dims) -> {out}")
    if args.model is None:   # the default model's memory: the search commands now consult it with no flag
        record_pipeline({"memory": out}, by=f"odqa build-memory -> {out}")


def cmd_verify(args) -> None:
    from odqa.common.io import checked_record, read_json, read_object, require_file, verify_checksums
    from odqa.common.weights import CHECKSUMS, check_sealed
    is_model = any((args.path / f).exists() for f in (CHECKSUMS, "config.json", "phrase_config.json"))
    if not (args.path / "manifest.json").exists() and is_model:
        if not (args.path / CHECKSUMS).exists():
            print(f"{args.path}: no {CHECKSUMS}, so nothing to check it against: a checkpoint odqa did not write "
                  f"(a hub, T5, FiD or DensePhrases directory), which loads as it is")
            return
        check_sealed(args.path, "checkpoint", whole=True)
        print(f"{args.path}: every file matches {CHECKSUMS} ({len(read_json(args.path / CHECKSUMS))} checked)")
        return
    manifest = read_object(require_file(args.path / "manifest.json", "index manifest"), "an index manifest")
    files = checked_record(manifest.get("files", {}), f"{args.path / 'manifest.json'}")
    if not files:
        raise InputError(f"{args.path}/manifest.json records no checksums (built before they were): rebuild the index")
    for name, want in files.items():
        problems = verify_checksums(args.path, {name: want})
        print(f"{name}: {want['bytes']} bytes, {'ok' if not problems else 'BAD'}")
        if problems:
            raise InputError(problems[0] + "; rebuild the index")
    print(f"{args.path}: every file matches manifest.json ({len(files)} checked)")


def add(sub) -> None:
    from odqa.common.defaults import default_supervision
    from odqa.common.paths import default_corpus, default_encoder
    sup = default_supervision()

    p = command(sub, "retrieve", cmd_retrieve,
                help="retrieve passages for a question set into a DPR-format file",
                description="Write [{question, answers, ctxs:[{id,title,text,score,has_answer}]}].")
    add_dataclass_args(p, RetrieveArgs)
    search_args(p)

    p = command(sub, "train-teacher", cmd_train_teacher,
                help="train a cross-encoder span reader for `train-phrase --teacher` to distil from",
                description="Question and passage read together by a BERT-family encoder with a SQuAD span "
                            "head, on the phrase model's supervision and tokens; validated by gold-passage EM.")
    config_arg(p)
    add_dataclass_args(p, TeacherTrainArgs, {
        "train_file": str(sup / "train.jsonl"), "validation_file": str(sup / "validation.jsonl"),
        "encoder": str(default_encoder())})

    p = command(sub, "train-phrase", cmd_train_phrase, help="train the dense phrase and question encoders",
                description="DensePhrases training: single-passage, in-batch and pre-batch negatives, filter "
                            "head; AdamW with warm-up and decay, clipping; through accelerate (`accelerate "
                            "launch -m odqa.system.cli train-phrase ...` for several processes or DeepSpeed).")
    config_arg(p)
    add_dataclass_args(p, PhraseTrainArgs, {
        "train_file": str(sup / "train.jsonl"), "validation_file": str(sup / "validation.jsonl"),
        "encoder": str(default_encoder()), "corpus": str(default_corpus())})

    p = command(sub, "dump-phrases", cmd_dump_phrases,
                help="encode every passage's phrase start/end vectors (sharded, resumable)",
                description="Start/end vectors of the tokens whose filter logit passes --threshold, float16, "
                            "in chunk files with their metadata. Re-running resumes an interrupted shard.")
    add_dataclass_args(p, DumpArgs)

    p = command(sub, "build-index", cmd_build_index, help="merge dump shards into a faiss phrase index",
                description="One start and one end index from a faiss index_factory string, with a manifest "
                            "that records each file's sha256.")
    add_dataclass_args(p, BuildIndexArgs)

    p = command(sub, "train-filter", cmd_train_filter,
                help="fit the phrase filter that decides which dumped tokens build-index keeps",
                description="An MLP over each token's dumped start/end vectors, trained to find answer "
                            "boundaries in supervision passages; prints tokens kept against answer phrases kept.")
    add_dataclass_args(p, FilterArgs, {"train_file": sup / "train.jsonl", "validation_file": sup / "validation.jsonl"})

    p = command(sub, "train-query", cmd_train_query, help="query-side fine-tuning against a fixed phrase index",
                description="Maximise the retrieval probability of the top phrases that match an answer "
                            "(--label phrase), lie in an answer passage (passage) or document (document).")
    config_arg(p)
    add_dataclass_args(p, QueryTrainArgs, {"corpus": str(default_corpus())})

    p = command(sub, "train-doc", cmd_train_doc,
                help="train the document retriever (DHR) that pre-filters phrase search",
                description="A question/document dual encoder over title + table of contents + abstract, "
                            "in-batch and hard negatives; resumable; validation document Top-k each epoch.")
    config_arg(p)
    add_dataclass_args(p, DocTrainArgs, {
        "train_file": str(sup / "train.jsonl"), "validation_file": str(sup / "validation.jsonl"),
        "corpus": str(default_corpus()), "encoder": str(default_encoder())})

    p = command(sub, "train-reranker", cmd_train_reranker,
                help="train the cross-encoder that reranks the search's top passages",
                description="A BERT-family cross-encoder (monoBERT) over question + passage, trained with one "
                            "answer-bearing passage against --negatives retrieved ones per question (a retrieval "
                            "file of the training questions); validated by reranking, its weight beside the "
                            "search's score tuned on validation.")
    config_arg(p)
    add_dataclass_args(p, RerankerTrainArgs, {"encoder": str(default_encoder())})

    p = command(sub, "build-doc-index", cmd_build_doc_index,
                help="encode every document summary into a faiss document index")
    add_dataclass_args(p, DocIndexArgs)

    p = command(sub, "tune-lambda", cmd_tune_lambda,
                help="grid-search the rerank weights of the document and BM25 scores on validation",
                description="lambda in 0, 0.1, ..., 2 and the BM25 weight mu in --bm25-grid maximising "
                            "validation Top-k of pre-filtered phrase retrieval reranked by z(passage) + lambda "
                            "z(document) + mu z(BM25); stored with the document index.")
    search_args(p)
    add_dataclass_args(p, TuneLambdaArgs, {"questions": sup / "validation.jsonl"})

    p = command(sub, "build-memory", cmd_build_memory,
                help="the answer memory: training questions whose answers nearby questions' votes borrow",
                description="Encode question sets with the phrase model's question encoders; the search commands "
                            "then let each question's nearest ones (cosine >= --memory-threshold) vote for their "
                            "answers where a top passage holds them as a phrase. Built for the default pipeline's "
                            "model, it becomes the pipeline's memory.")
    add_dataclass_args(p, MemoryArgs)

    p = command(sub, "verify", cmd_verify, help="check an index's or a checkpoint's files against their checksums",
                description="Hash every file of a phrase or document index (or a dense index under a corpus) "
                            "and compare with manifest.json, or of a checkpoint odqa wrote and compare with "
                            "checksums.json. Opening an index checks every size but hashes only files up to "
                            "256 MB, and loading a checkpoint remembers the hash of each file it has checked; "
                            "this hashes every file anew.")
    add_dataclass_args(p, VerifyArgs)
