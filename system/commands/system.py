"""The whole system's commands: `demo`, `run` (extractive vs generated EM), `ask` and `serve`."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from odqa.common.device import pick_device
from odqa.common.questions import checked_question
from odqa.reader.args import ReaderSettings
from odqa.system.args import AskArgs, DemoArgs, Evaluation, RunArgs, ServeConfig
from odqa.system.commands.args import (
    add_dataclass_args,
    command,
    dataclass_from_args,
)
from odqa.system.commands.retrieval import pipeline_of, search_args


def system_args(p: argparse.ArgumentParser) -> None:
    """A pipeline's flags: its parts (`PipelineParts`) and its search and reading settings, each unset
    unless given, so that the default pipeline's record can fill it."""
    search_args(p, reader=True)
    add_dataclass_args(p, ReaderSettings, unset=True)


def shown(path) -> str:
    """A path as /health shows it: relative to $ODQA_HOME when inside it, else its last component (a
    public endpoint should not map the server's file system)."""
    from odqa.common.paths import odqa_home
    path = Path(path).resolve()
    try:
        return str(path.relative_to(odqa_home().resolve()))
    except ValueError:
        return path.name


def cmd_demo(args) -> None:
    from odqa.system.demo import run_demo
    from odqa.system.recipe_config import demo_fields
    overrides = {f.name: getattr(args, f.name) for f in demo_fields()}
    print(run_demo(out_dir=args.out, preset=args.preset, plan_only=args.plan, **overrides), end="")


def cmd_run(args) -> None:
    from odqa.common.ranks import current
    from odqa.system.report import markdown
    from odqa.system.run import run
    # the settings of the flags given over the record's; the parts (and whether the memory joins) are run's to resolve
    p = pipeline_of(args, reader=True)
    rows = run(RunArgs(out_dir=args.out_dir, parts=dataclass_from_args(RunArgs, args).parts, search=p.search_config,
                       reading=p.settings, evaluation=dataclass_from_args(Evaluation, args)))
    if not current().main:   # rank 0 writes and prints the report
        return
    print(markdown(rows))
    print(f"report.md, report.json, questions.jsonl, em_by_k.png, topk.png -> {args.out_dir}")


def cmd_ask(args) -> None:
    question = checked_question(args.question)   # before the models load: a bad question is refused at once
    qa = pipeline_of(args, reader=True).loaded()
    a = qa.ask(question, k=args.k)
    ex = a.extractive
    print(f"question:   {a.question}")
    votes = f", {ex.support:.0%} of the top passages' votes" if ex and ex.support is not None else ""
    print(f"extractive: {ex.text if ex else '-'}" + (f"  (phrase score {ex.score:.2f}, {ex.passage_id}{votes})" if ex else ""))
    if qa.searcher.artifacts.memory is not None and not a.memory:
        print("memory:     on, no training question near enough to lend its answers (--no-memory leaves it out)")
    for m in a.memory:
        print(f"memory:     {m.question!r} (cosine {m.similarity:.2f}): {' | '.join(m.answers[:3])}")
    how = ", chosen among their phrases" if qa.settings.decoding == "phrases" else ""
    print(f"generated:  {a.generated}  (FiD over {len(a.passages)} passages{how})")
    for i, p in enumerate(a.passages, 1):
        title, text = marked(p.title, p.phrase, True), marked(p.text, p.phrase, False)
        print(f"{i:>2}. {title} ({p.score:.2f}): {text[:300]}")
    print(f"retrieve {a.timings['retrieve_ms']:.0f} ms, read {a.timings['read_ms']:.0f} ms")


def marked(s: str, phrase, title: bool) -> str:
    """`s` (a passage's title or text) with `phrase` (a `Phrase`) in [[...]] where it lies in `s`."""
    if phrase is None or phrase.in_title != title:
        return s
    a, b = phrase.char_start, phrase.char_end
    return s[:a] + "[[" + s[a:b] + "]]" + s[b:]


# Measured on one core of a CPU with AMX (docs/notes/serving.md, 2026-12-03): a batch of 8 questions costs
# 0.75x per question what one does (the question encoders batch, the reader decodes 8 at once), and with
# freed memory kept (`keep_freed_memory`) the encoder's activations no longer page-fault in; batches of up
# to 8, admitted while a second of work is ahead, answered 1.6x the requests a second of one question at
# a time when idle, with the p99 under overload 1.73x its value at peak. On a GPU a batch costs little
# more than one question: 16, and a second's queue.
SERVE_LIMITS = {"cpu": (8, 1.0), "cuda": (16, 1.0)}


def serve_limits(max_batch: int | None, max_queue_s: float | None, device: str) -> tuple[int, float]:
    """--max-batch and --max-queue-s as given, or the device's defaults."""
    batch, queue_s = SERVE_LIMITS["cpu" if device == "cpu" else "cuda"]
    return (batch if max_batch is None else max_batch), (queue_s if max_queue_s is None else max_queue_s)


SERVE_ARGS = "ODQA_SERVE_ARGS"   # how `serve --workers N` hands its flags to each worker process


def cmd_serve(args) -> None:
    import uvicorn

    # A missing or damaged part is refused now, by name, not after the server is up; the models then
    # load in a thread, so the port opens at once.
    from odqa.reader.read import check_reader
    check_reader(str(pipeline_of(args, reader=True).parts.reader))
    from odqa.system.serve import REQUEST_TIMEOUT_ENV, TimedH11Protocol
    # the protocol reads the deadline from the environment, which worker processes inherit
    os.environ[REQUEST_TIMEOUT_ENV] = str(args.request_timeout_s)
    run = {"host": args.host, "port": args.port, "log_level": "info", "timeout_graceful_shutdown": args.graceful_s,
           "http": f"{TimedH11Protocol.__module__}:{TimedH11Protocol.__qualname__}"}   # an import string: workers import it
    if args.workers == 1:
        uvicorn.run(serve_app(args), **run)
        return
    # N processes behind one socket, each with its own models and limits; the indexes are memory-mapped,
    # so their pages are in memory once for all. Prometheus' multiprocess mode sums the workers' metrics
    # in whichever one /metrics reaches, through files in a directory of this server's own.
    import shutil
    import tempfile
    metrics_dir = tempfile.mkdtemp(prefix="odqa-serve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ[SERVE_ARGS] = json.dumps({k: v for k, v in vars(args).items() if not callable(v)}, default=str)
    try:
        uvicorn.run("odqa.system.commands.system:serve_app_from_environment", factory=True, workers=args.workers, **run)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def serve_app(args):
    """The service of `odqa serve`'s flags (one worker's)."""
    from odqa.system.serve import create_app
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    max_batch, max_queue_s = serve_limits(args.max_batch, args.max_queue_s, pick_device())
    qa = pipeline_of(args, reader=True)   # once: the loader and /health name the same parts
    parts = qa.parts
    return create_app(load=qa.loaded, max_batch=max_batch, max_wait_ms=args.max_wait_ms,
                      max_queue=args.max_queue, max_queue_s=None if max_queue_s < 0 else max_queue_s,
                      timeout_s=args.timeout_s,
                      info={"index": shown(parts.index), "reader": shown(parts.reader),
                            "prefilter": shown(parts.doc_index) if parts.doc_index else None})


def serve_app_from_environment():
    """A worker's app under `serve --workers N` (uvicorn imports this in each worker process)."""
    return serve_app(argparse.Namespace(**json.loads(os.environ[SERVE_ARGS])))


def add(sub) -> None:
    p = command(sub, "demo", cmd_demo, help="run the whole system on the default data: train, index, evaluate, answer",
                description="Fetch the data, build the corpus, train the phrase, document and FiD models on "
                            "short schedules, index, run `odqa run` on a slice of NQ-test and TQA-test, print "
                            "the report and three answers. A rerun reuses every finished stage.")
    add_dataclass_args(p, DemoArgs)
    from odqa.system.recipe_config import RecipeConfig  # its own fields that are the demo's flags
    add_dataclass_args(p, RecipeConfig, only=lambda f: f.metadata.get("demo"), unset=True)

    p = command(sub, "run", cmd_run,
                help="evaluate the system: extractive vs generated EM per question set and k, with plots",
                description="Phrase retrieval (with the document pre-filter if given), FiD at each k, a report "
                            "table, per-question JSONL and PNG plots in OUT; a rerun reuses what is done.")
    add_dataclass_args(p, RunArgs, unset=True)

    p = command(sub, "ask", cmd_ask, quick_exit=True,
                help="answer one question: the extractive and the generated answer, and the passages")
    add_dataclass_args(p, AskArgs)
    system_args(p)

    p = command(sub, "serve", cmd_serve,
                help="serve answers over HTTP (POST /answer, GET /health, /metrics, docs at /docs)",
                description="FastAPI service; concurrent requests are batched for the question encoders and FiD.")
    system_args(p)
    add_dataclass_args(p, ServeConfig)
