"""A scale rehearsal: every stage of the chain at growing corpus sizes, under 1 and 2 ranks, with wall
time, peak RSS and disk, fitted in N and extrapolated to DPR's 21M passages.

    python scripts/bench_scale.py [--sizes 10000 100000 300000] [--out /tmp/bench-scale] [--json results.json]
        [--stages STAGE ...] [--repeat N]

The corpus is synthetic: passages of the real passages' lengths, their words drawn from the real
passages' words (the data pack's Wikipedia, `odqa data fetch`), three passages a document, written as
a gzipped JSONL. The models are tiny and random (a 2-layer BERT of width 64 over the corpus's most
frequent words; the phrase model over it; a bert2bert reader warm-started from it): this measures
odqa's machinery (reading, batching, index building, search, merging, serving), not a model.

Each stage is a whole `odqa` command, timed as a user runs it, one thread a process, under
`torchrun --nproc_per_node R` (R = 1 and 2 for the stages that split by rank). Peak RSS is the
largest process's (ru_maxrss of the waited-for descendants). Search is timed apart, in one process
over the built index: the phrase index's whole-index search (nprobe 64) beside a dense index of the
same number of passages (Flat, and the IVF a user would pick at that size).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

WRAP = """
import json, resource, subprocess, sys, time
start = time.perf_counter()
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"seconds": time.perf_counter() - start, "rc": done.returncode,
                  "rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "stderr": done.stderr[-3000:]}))
"""
ODQA = [sys.executable, "-m", "odqa.system.cli", "-q"]
SPLIT = ("dump-phrases", "build-index", "retrieve phrase", "retrieve dense", "read")
TARGET = 21_015_324   # DPR's psgs_w100


def odqa(*args: str, ranks: int | None = None) -> list[str]:
    if ranks is None:
        return [*ODQA, *args]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={ranks}", "--standalone",
            "-m", "odqa.system.cli", "-q", *args]


def measure(cmd: list[str]) -> dict:
    """Wall seconds and the largest process's peak RSS of one whole command."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-c", WRAP, *cmd], capture_output=True, text=True, env=env)
    result = json.loads(out.stdout)
    if result["rc"]:
        sys.exit(f"{' '.join(cmd)} failed:\n{result['stderr']}")
    return {"seconds": result["seconds"], "rss_mb": result["rss_mb"]}


def disk_mb(*paths: Path) -> float:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()) / 2**20


# --- the synthetic world ------------------------------------------------------------------------

def real_passages() -> tuple[list[str], np.ndarray]:
    """The data pack's words, in order, and its passages' lengths in words."""
    from odqa.common.paths import odqa_home
    from odqa.common.splitter import split_passages
    source = odqa_home() / "data" / "wiki_summaries" / "documents.jsonl"
    if not source.exists():
        sys.exit(f"{source} not found: run `odqa data fetch` first")
    words, lengths = [], []
    for line in source.open(encoding="utf-8"):
        for section in json.loads(line)["sections"]:
            text = "\n".join(section.get("paragraphs", []))
            for a, b in split_passages(text, 100):
                w = text[a:b].split()
                words += w
                lengths.append(len(w))
    return words, np.array(lengths)


def write_corpus(path: Path, n: int, words: list[str], lengths: np.ndarray, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    vocab = np.array(words)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for i, length in enumerate(rng.choice(lengths, n)):
            text = " ".join(vocab[rng.integers(0, len(vocab), length)])
            f.write(json.dumps({"id": f"p{i}", "title": f"Document {i // 3}", "text": text}) + "\n")


def write_questions(path: Path, n: int, words: list[str], seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    vocab = np.array(words)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            q = " ".join(vocab[rng.integers(0, len(vocab), 8)])
            f.write(json.dumps({"id": f"q{i}", "question": f"what is {q}", "answers": [str(vocab[rng.integers(len(vocab))])]})
                    + "\n")


def tiny_models(root: Path, words: list[str]) -> dict[str, Path]:
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    from odqa.retriever.args import PhraseModelConfig
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_filter import PhraseFilter
    from odqa.retriever.phrase_model import DensePhraseModel
    common = [w for w, _ in Counter(t for w in words for t in re.findall(r"\w+|[^\w\s]", w.lower())).most_common(8000)]
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *common])}
    torch.manual_seed(0)
    bert = root / "bert"
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=256)).save_pretrained(bert)
    BertTokenizer(vocab=vocab).save_pretrained(bert)
    DensePhraseModel(PhraseModelConfig(encoder=str(bert), max_passage_tokens=160)).save_pretrained(root / "phrase",
                                                                                        load_tokenizer(bert))
    done = subprocess.run(odqa("reader", "init", "--from", str(bert), "--out", str(root / "reader")),
                          capture_output=True, text=True)
    if done.returncode:
        sys.exit(done.stderr)
    filt = PhraseFilter(32, 64)
    torch.save(filt.state_dict(), root / "filter.pt")
    return {"bert": bert, "phrase": root / "phrase", "reader": root / "reader", "filter": root / "filter.pt"}


def put_filter(dump: Path, corpus: Path, models: dict) -> None:
    """A random phrase filter, recorded as fitted on this dump's encoder, with every token's score saved
    as `train-filter` saves them: build-index keeps 20% by it, reading the scores, not the dump."""
    from odqa.retriever.phrase_dump import dump_chunks
    from odqa.retriever.phrase_filter import chunk_scores, chunk_stamps, load_filter
    filt = dump / "filter"
    filt.mkdir(exist_ok=True)
    shutil.copy(models["filter"], filt / "filter.pt")
    chunks, summary = dump_chunks(dump, corpus)
    info = {"dim": 32, "hidden": 64, "encoder_hash": summary["encoder_hash"]}
    (filt / "filter.json").write_text(json.dumps(info))
    np.save(filt / "scores.npy", np.concatenate(chunk_scores(load_filter(filt)[0], chunks)))
    (filt / "filter.json").write_text(json.dumps({**info, "scores_of": chunk_stamps(chunks)}))


# --- search timing ------------------------------------------------------------------------------

SEARCH = """
import json, sys, time
import faiss, numpy as np
from odqa.retriever.phrase_index import PhraseIndex
index_dir, dense_file, n_q = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
def per_question(search, q):
    search(q[:8])
    start = time.perf_counter(); search(q); return (time.perf_counter() - start) / len(q)
ix = PhraseIndex(index_dir, nprobe=64)
q = rng.standard_normal((n_q, ix.manifest["dim"]), dtype=np.float32)
phrase = per_question(lambda x: (ix.search("start", x, 100), ix.search("end", x, 100)), q)
flat = faiss.read_index(dense_file)
n, d = flat.ntotal, flat.d
vectors = flat.reconstruct_n(0, n)
nlist = int(2 ** round(np.log2(4 * np.sqrt(n))))   # a dense IVF's usual lists: about 4 sqrt(N)
ivf = faiss.index_factory(d, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
ivf.train(vectors[rng.choice(n, min(n, 64 * nlist), replace=False)])
ivf.add(vectors)
ivf.nprobe = 64
qd = rng.standard_normal((n_q, d), dtype=np.float32)
print(json.dumps({"phrase_s": phrase, "flat_s": per_question(lambda x: flat.search(x, 100), qd),
                  "ivf_s": per_question(lambda x: ivf.search(x, 100), qd), "ivf": f"IVF{nlist},Flat"}))
"""


def time_search(index: Path, dense: Path, n_q: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", SEARCH, str(index), str(dense), str(n_q)], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        sys.exit(done.stderr)
    return json.loads(done.stdout)


# --- the rehearsal ------------------------------------------------------------------------------

def timed_split(rows: dict, stage: str, ranks: tuple[int, ...], run, repeat: int) -> None:
    """`run(r)` (the stage under r ranks, its output removed first) for each r in `ranks`, as rows
    "STAGE xR". Under `repeat` > 1 the 1-rank and 2-rank runs alternate, so that each pair shares the
    shared machine's conditions of the moment: a row's seconds are the median of its runs, its peak RSS
    the largest, and `runs` keeps every run's seconds."""
    runs: dict[int, list[dict]] = {r: [] for r in ranks}
    for _ in range(repeat if len(ranks) > 1 else 1):
        for r in ranks:
            runs[r].append(run(r))
    for r, done in runs.items():
        rows[f"{stage} x{r}"] = {**done[-1], "seconds": float(np.median([d["seconds"] for d in done])),
                                 "rss_mb": max(d["rss_mb"] for d in done), "runs": [d["seconds"] for d in done]}


def split_ratio(stages: dict, stage: str) -> tuple[float, list[float]]:
    """2 ranks' time over 1 rank's: the median of the alternating pairs' ratios, and the ratios."""
    one, two = stages[f"{stage} x1"], stages[f"{stage} x2"]
    pairs = [b / a for a, b in zip(one.get("runs", [one["seconds"]]), two.get("runs", [two["seconds"]]))]
    return float(np.median(pairs)), pairs


def rehearse(root: Path, n: int, words, lengths, models: dict, n_questions: int, only: set[str] | None = None,
             repeat: int = 1) -> dict:
    """Every stage, or the split stages in `only` under 1 and 2 ranks and what they need under 2."""
    root.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    timed = lambda stage: only is None or stage in only                       # noqa: E731
    ranks = lambda stage: (1, 2) if timed(stage) else (2,)                    # noqa: E731
    source, corpus, questions = root / "passages.jsonl.gz", root / "corpus", root / "questions.jsonl"
    write_corpus(source, n, words, lengths)
    write_questions(questions, n_questions, words)
    rows["corpus build"] = {**measure(odqa("corpus", "build", "--input", str(source), "--out", str(corpus))),
                            "disk_mb": disk_mb(corpus)}
    split = lambda stage, run: timed_split(rows, stage, ranks(stage), run, repeat)   # noqa: E731

    def dump_phrases(r):
        shutil.rmtree(root / f"dump{r}", ignore_errors=True)
        return {**measure(odqa("dump-phrases", "--model", str(models["phrase"]), "--corpus", str(corpus),
                               "--out", str(root / f"dump{r}"), ranks=r)), "disk_mb": disk_mb(root / f"dump{r}")}
    split("dump-phrases", dump_phrases)
    put_filter(root / "dump2", corpus, models)
    shutil.rmtree(root / "dump1", ignore_errors=True)   # the two dumps build the same index; one is enough on disk
    dump = root / "dump2"

    def build(r):
        shutil.rmtree(root / f"index{r}", ignore_errors=True)
        return {**measure(odqa("build-index", "--dump", str(dump), "--corpus", str(corpus), "--keep", "0.2",
                               "--out", str(root / f"index{r}"), ranks=r)), "disk_mb": disk_mb(root / f"index{r}")}
    split("build-index", build)
    index = root / "index2"
    phrase = ("--index", str(index), "--model", str(models["phrase"]), "--corpus", str(corpus))

    def retrieve_phrase(r):
        out = root / f"phrase{r}.json"
        out.unlink(missing_ok=True)
        return {**measure(odqa("retrieve", "--retriever", "phrase", *phrase, "--questions", str(questions), "--k", "10",
                               "--batch-size", "16", "--out", str(out), ranks=r)), "disk_mb": disk_mb(out)}
    if timed("retrieve phrase") or timed("read"):
        split("retrieve phrase", retrieve_phrase)

    def retrieve_dense(r):
        shutil.rmtree(corpus / "dense-bert", ignore_errors=True)   # each run encodes the corpus
        out = root / f"dense{r}.json"
        out.unlink(missing_ok=True)
        return {**measure(odqa("retrieve", "--retriever", "dense", "--model", str(models["bert"]), "--corpus",
                               str(corpus), "--questions", str(questions), "--k", "10", "--out", str(out), ranks=r)),
                "disk_mb": disk_mb(corpus / "dense-bert")}
    if timed("retrieve dense"):
        split("retrieve dense", retrieve_dense)

    def read(r):
        out = root / f"pred{r}.jsonl"
        out.unlink(missing_ok=True)
        return {**measure(odqa("read", "--model", str(models["reader"]), "--input", str(root / "phrase2.json"),
                               "--k", "5", "--out", str(out), ranks=r)), "disk_mb": disk_mb(out)}
    if timed("read"):
        split("read", read)
    if only is not None:   # run, serve and search come with every stage only
        return {"passages": n, "stages": rows}
    rows["run x2"] = {**measure(odqa("run", *phrase, "--reader", str(models["reader"]), "--questions", str(questions),
                                     "--k", "5", "--baselines", "none", "--out", str(root / "run"), ranks=2)),
                      "disk_mb": disk_mb(root / "run")}
    rows["serve x2 workers"] = serve(phrase, models, root)
    search = time_search(index, corpus / "dense-bert" / "passages.faiss", n_questions)
    return {"passages": n, "stages": rows, "search": search,
            "index_vectors": json.loads((index / "manifest.json").read_text())["vectors"]}


def serve(phrase: tuple, models: dict, root: Path, requests: int = 32) -> dict:
    """Seconds from start to both workers ready and `requests` answered; the largest worker's RSS."""
    import signal
    import socket

    import httpx
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    server = subprocess.Popen(odqa("serve", *phrase, "--reader", str(models["reader"]), "--workers", "2", "--port",
                                   str(port), "--threads", "1", "--max-queue-s", "-1"),
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if len(re.findall(r'odqa_worker_ready\{pid="\d+"\} 1\.0', httpx.get(f"{url}/metrics").text)) == 2:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.perf_counter() - start > 900:
                sys.exit("serve did not start")
            time.sleep(0.5)
        ready = time.perf_counter() - start
        for i in range(requests):
            r = httpx.post(f"{url}/answer", json={"question": f"what is the question {i}", "k": 5}, timeout=120)
            r.raise_for_status()
        rss = max(_rss_mb(int(pid)) for pid in re.findall(r'odqa_worker_ready\{pid="(\d+)"\}',
                                                             httpx.get(f"{url}/metrics").text))
        return {"seconds": time.perf_counter() - start, "ready_seconds": ready, "rss_mb": rss}
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=120)


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024


# --- fits ---------------------------------------------------------------------------------------

def fit(results: list[dict]) -> dict:
    """For each stage: how time and RSS grow from the smallest to the largest size (the exponent of N,
    and the RSS ratio), RSS = a + b N by least squares (b: bytes a passage), and both at 21M."""
    ns = np.array([r["passages"] for r in results], float)
    out = {}
    for stage in results[0]["stages"]:
        if len(results) < 2:
            break
        t = np.array([r["stages"][stage]["seconds"] for r in results])
        rss = np.array([r["stages"][stage]["rss_mb"] for r in results])
        slope, intercept = np.polyfit(ns, rss, 1)
        time_slope, time_icpt = np.polyfit(ns, t, 1)
        out[stage] = {"time_exponent": float(np.log(t[-1] / t[0]) / np.log(ns[-1] / ns[0])),
                      "rss_ratio": float(rss[-1] / rss[0]), "bytes_per_passage": float(slope * 2**20),
                      "rss_21m_gb": float((intercept + slope * TARGET) / 1024),
                      "seconds_per_passage": float(time_slope), "fixed_seconds": float(time_icpt)}
    if "search" not in results[0] or len(results) < 2:
        return out
    s = np.array([r["search"]["phrase_s"] for r in results])
    out["search"] = {"phrase_exponent": float(np.log(s[-1] / s[0]) / np.log(ns[-1] / ns[0]))}
    return out


def report(results: list[dict], fits: dict) -> str:
    lines = ["| stage | " + " | ".join(f"{r['passages']:,}: s / peak RSS MB / disk MB" for r in results)
             + " | RSS x (smallest -> largest) | bytes a passage | RSS at 21M (GB) |",
             "|---|" + "---:|" * (len(results) + 3)]
    for stage in results[0]["stages"]:
        f = fits.get(stage)
        cells = [f"{r['stages'][stage]['seconds']:.1f} / {r['stages'][stage]['rss_mb']:.0f} / "
                 f"{r['stages'][stage].get('disk_mb', 0):.0f}" for r in results]
        lines.append(f"| {stage} | " + " | ".join(cells) + (f" | {f['rss_ratio']:.2f} | {f['bytes_per_passage']:.0f} | "
                                                           f"{f['rss_21m_gb']:.1f} |" if f else " | | | |"))
    lines += ["", "| split stage | " + " | ".join(f"{r['passages']:,}: 2 ranks / 1 rank" for r in results) + " |",
              "|---|" + "---:|" * len(results)]
    for stage in (s for s in SPLIT if f"{s} x1" in results[0]["stages"]):
        ratios = [split_ratio(r["stages"], stage) for r in results]
        lines.append(f"| {stage} | " + " | ".join(
            f"{median:.2f}x" + (f" ({', '.join(f'{x:.2f}' for x in pairs)})" if len(pairs) > 1 else "")
            for median, pairs in ratios) + " |")
    if "search" not in fits:
        return "\n".join(lines)
    lines += ["", "| passages | index vectors | phrase search ms/question | dense Flat | dense IVF | phrase / Flat q/s | "
                  "phrase / IVF q/s |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        s = r["search"]
        lines.append(f"| {r['passages']:,} | {r['index_vectors']:,} | {1000 * s['phrase_s']:.2f} | "
                     f"{1000 * s['flat_s']:.2f} | {1000 * s['ivf_s']:.2f} ({s['ivf']}) | "
                     f"{s['flat_s'] / s['phrase_s']:.2f} | {s['ivf_s'] / s['phrase_s']:.2f} |")
    lines.append(f"\nwhole-index phrase search time a question grows as N^{fits['search']['phrase_exponent']:.2f}")
    return "\n".join(lines)


def search_only(root: Path, n: int, tokens: int, dim: int, n_questions: int) -> dict:
    """Search timed over a synthetic dump of random vectors (`tokens` a passage, the rehearsal's 15)
    indexed with the default factory, beside a Flat index of random passage vectors."""
    import faiss
    from bench_build_memory import synthetic_dump

    from odqa.retriever.args import BuildIndexArgs
    from odqa.retriever.index_build import build_index
    root.mkdir(parents=True)
    dump, corpus, _ = synthetic_dump(root, n, tokens, dim)
    manifest = build_index(BuildIndexArgs(dump=dump, out=root / "index", corpus=corpus, factory=None, keep=1.0))
    flat = faiss.IndexFlatIP(64)
    flat.add(np.random.default_rng(0).standard_normal((n, 64), dtype=np.float32))
    faiss.write_index(flat, str(root / "dense.faiss"))
    return {"passages": n, "index_vectors": manifest["vectors"], "factory": manifest["factory"],
            "search": time_search(root / "index", root / "dense.faiss", n_questions)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--search-only", action="store_true",
                   help="time search alone, over synthetic indexes of random vectors (15 a passage, 32 dims)")
    p.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 300_000])
    p.add_argument("--questions", type=int, default=256, help="questions a size (default 256)")
    p.add_argument("--out", type=Path, default=Path("/tmp/bench-scale"), help="scratch directory (removed after)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each timed split stage this many times under 1 and 2 ranks, alternating, and report "
                        "the median (default 1)")
    p.add_argument("--stages", nargs="+", default=None, choices=SPLIT,
                   help="time only these split stages, under 1 and 2 ranks, running what they need under 2; "
                        "default: every stage, run, serve and search included")
    args = p.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    if args.search_only:
        rows = [search_only(args.out / str(n), n, 15, 32, args.questions) for n in args.sizes]
        shutil.rmtree(args.out)
        for r in rows:
            s = r["search"]
            print(f"| {r['passages']:,} | {r['index_vectors']:,} ({r['factory']}) | {1000 * s['phrase_s']:.2f} | "
                  f"{1000 * s['flat_s']:.2f} | {1000 * s['ivf_s']:.2f} ({s['ivf']}) |")
        exponent = np.log(rows[-1]["search"]["phrase_s"] / rows[0]["search"]["phrase_s"]) / np.log(
            rows[-1]["passages"] / rows[0]["passages"])
        print(f"whole-index phrase search time a question grows as N^{exponent:.2f}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    words, lengths = real_passages()
    os.environ["ODQA_HOME"] = str(args.out / "home")   # no default pipeline: every path is given
    models = tiny_models(args.out / "models", words)
    results = []
    try:
        for n in args.sizes:
            results.append(rehearse(args.out / str(n), n, words, lengths, models, args.questions,
                                    set(args.stages) if args.stages else None, args.repeat))
            print(f"{n:,} passages done", file=sys.stderr)
            shutil.rmtree(args.out / str(n))
    finally:
        if args.json and results:
            args.json.write_text(json.dumps(results, indent=1))
    fits = fit(results)
    print(report(results, fits))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "fits": fits}, indent=1))
    shutil.rmtree(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
