"""The GPU path in one prepared run: phrase dumping in bf16, index training and whole-index search on the
GPU beside the CPU, FiD training under DeepSpeed (ZeRO-2 in bf16, ZeRO-3 with CPU offload) and FiD
generation, each measured and checked, on synthetic data and random weights made here:

    python scripts/gpu_check.py              # one GPU (H100/H200 class): ~200k passages, BERT-base and t5-base
                                             # sizes, under 8 minutes
    python scripts/gpu_check.py --cpu        # tiny sizes on the CPU, the same code: the suite runs it

Every stage goes through odqa's own functions (dump_phrases, index_build, PhraseIndex, train_reader,
generate). It prints one table (stage, figure, check) and writes OUT/gpu_check.json; it exits 1 if a
check fails. On the CPU the "accelerated" side of each comparison is the same wiring with CPU indexes
(the assign indexes of `index_build._train`, the filled faiss lists the GPU copy is made from).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np
import torch

SIZES = {
    "gpu": dict(passages=200_000, words=24, vocab_words=20_000, hidden=768, layers=12, heads=12, max_tokens=32,
                dump_batch=512, keep=0.25, factory="OPQ32,IVF1024,PQ32", train=100_000, base=500_000, queries=1000,
                nprobe=64, reader="base", reader_vocab=8000, steps=20, batch=4, train_k=10, read_ks=(10, 25, 100),
                read_questions=64, read_batch=8),
    "cpu": dict(passages=400, words=12, vocab_words=300, hidden=32, layers=2, heads=2, max_tokens=24, dump_batch=32,
                keep=1.0, factory="OPQ4,IVF16,PQ4", train=4000, base=3000, queries=50, nprobe=8, reader="tiny",
                reader_vocab=300, steps=3, batch=2, train_k=2, read_ks=(2, 5), read_questions=4, read_batch=2),
}
BF16_REL_ERROR = 0.05      # bf16 keeps 8 bits of mantissa: a few tenths of a percent a layer
RECALL_GAP = 0.05          # recall@100 of the accelerated training against the CPU's
OVERLAP = 0.95             # top-100 overlap of the two searches of one index


def words(n: int) -> list[str]:
    return [f"w{i}" for i in range(n)]


def make_corpus(root: Path, s: dict, rng) -> Path:
    from odqa.common.corpus import build_corpus
    vocab = words(s["vocab_words"])
    rows = ({"id": f"p{i}", "title": f"t{i}", "text": " ".join(rng.choice(vocab, s["words"]))} for i in range(s["passages"]))
    source = root / "passages.jsonl"
    with open(source, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    build_corpus([source], root / "corpus")
    return root / "corpus"


def make_phrase_model(root: Path, s: dict) -> Path:
    """A phrase model over a BERT of the size asked for, its weights random, its vocabulary the corpus's."""
    from transformers import BertConfig, BertModel, BertTokenizer

    from odqa.retriever.args import PhraseModelConfig
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_model import DensePhraseModel
    (root / "bert").mkdir()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (root / "bert" / "vocab.txt").write_text("\n".join(specials + words(s["vocab_words"])) + "\n")
    tokenizer = BertTokenizer(str(root / "bert" / "vocab.txt"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                         num_attention_heads=s["heads"], intermediate_size=4 * s["hidden"],
                         max_position_embeddings=max(64, 2 * s["max_tokens"]))).save_pretrained(root / "bert")
    tokenizer.save_pretrained(root / "bert")
    model = root / "phrase"
    DensePhraseModel(PhraseModelConfig(encoder=str(root / "bert"), max_passage_tokens=s["max_tokens"])).save_pretrained(
        model, tokenizer=load_tokenizer(root / "bert"))
    return model


def bf16_error(model_dir: Path, corpus: Path, device: str) -> float:
    """Relative error of the start vectors of 64 passages encoded under bf16 autocast, against float32."""
    from odqa.common.corpus import PassageStore
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_data import encode_passages
    from odqa.retriever.phrase_model import DensePhraseModel
    model = DensePhraseModel.from_pretrained(model_dir).to(device).eval()
    store = PassageStore(corpus)
    passages = [store[i] for i in range(min(64, len(store)))]
    enc = encode_passages(load_tokenizer(model_dir), [p["title"] for p in passages], [p["text"] for p in passages],
                          model.config.max_passage_tokens)
    batch = {k: v.to(device) for k, v in enc.batch.items()}
    with torch.no_grad():
        exact = model.encode_passages(**batch)[0].float()
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
            low = model.encode_passages(**batch)[0].float()
    mask = enc.batch["attention_mask"].to(device).bool()
    return float((low - exact)[mask].norm() / exact[mask].norm())


def dump_sample(dump: Path, corpus: Path, n: int) -> np.ndarray:
    from odqa.retriever.phrase_dump import dump_chunks, read_chunk
    chunks, _ = dump_chunks(dump, corpus)
    parts, got = [], 0
    for c in chunks:
        parts.append(read_chunk(c, ("start",))["start"].astype(np.float32))
        got += len(parts[-1])
        if got >= n:
            break
    return np.concatenate(parts)[:n]


def recall_at(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(found, exact)]))


def index_training(vectors: np.ndarray, s: dict, on_gpu: bool) -> dict:
    """The same factory trained twice on one sample, through index_build's accelerated wiring (GPU flats, or
    CPU flats with --cpu) and faiss's plain CPU training: recall@100 of each against exact search."""
    from odqa.retriever import index_build
    dim, q = vectors.shape[1], s["queries"]
    queries, base = vectors[:q], vectors[q:q + s["base"]]
    sample = vectors[q:q + s["train"]]
    exact = faiss.IndexFlatIP(dim)
    exact.add(base)
    truth = exact.search(queries, 100)[1]
    out = {}
    flat = None if on_gpu else (lambda d, every: faiss.IndexFlatL2(d))
    for name, train in (("accelerated", lambda idx: index_build._train(idx, sample, flat=flat)),
                        ("cpu", lambda idx: idx.train(sample))):
        index = faiss.index_factory(dim, s["factory"], faiss.METRIC_INNER_PRODUCT)
        faiss.downcast_index(faiss.extract_index_ivf(index)).do_polysemous_training = False
        start = time.perf_counter()
        train(index)
        seconds = time.perf_counter() - start
        index.add(base)
        faiss.extract_index_ivf(index).nprobe = s["nprobe"]
        out[name] = {"train_s": seconds, "recall@100": recall_at(index.search(queries, 100)[1], truth)}
    return out


def whole_index_search(index_dir: Path, queries: np.ndarray, s: dict, on_gpu: bool) -> dict:
    """One side of the built index searched whole twice: from its memory-mapped codes (the CPU path) and on
    the GPU (sharded, `retriever.index_gpu`), or with --cpu from the faiss lists the GPU copy is filled from."""
    from odqa.retriever.phrase_index import PhraseIndex
    cpu = PhraseIndex(index_dir, nprobe=s["nprobe"], gpu=False)
    if on_gpu:
        other = PhraseIndex(index_dir, nprobe=s["nprobe"], gpu=True)
        search = lambda q: other.search("start", q, 100)   # noqa: E731
    else:
        filled = faiss.clone_index(cpu._faiss["start"])
        cpu._codes["start"].fill(filled, np.arange(len(cpu._codes["start"].codes)))
        faiss.extract_index_ivf(filled).nprobe = s["nprobe"]
        search = lambda q: filled.search(q, 100)   # noqa: E731
    out = {}
    for name, run in (("codes (CPU)", lambda q: cpu.search("start", q, 100)), ("accelerated", search)):
        run(queries[:8])   # warm: the GPU copy is made on first use
        start = time.perf_counter()
        out[name] = {"ids": run(queries)[1], "q/s": len(queries) / (time.perf_counter() - start)}
    overlap = recall_at(out["accelerated"]["ids"], out["codes (CPU)"]["ids"])
    return {"overlap@100": overlap, **{f"{name} q/s": v["q/s"] for name, v in out.items()}}


def fid_examples(n: int, k: int, rng, vocab: list[str]) -> list[dict]:
    """Questions whose answer (a word) is in one of their k passages, the rest random words."""
    rows = []
    for i in range(n):
        name, answer = f"n{i}", str(rng.choice(vocab))
        gold = int(rng.integers(k))
        ctxs = [{"id": f"{i}-{j}", "title": f"t{j}", "score": float(k - j), "has_answer": j == gold,
                 "text": f"the code of {name} is {answer} ." if j == gold else " ".join(rng.choice(vocab, 12))}
                for j in range(k)]
        rows.append({"id": str(i), "question": f"what is the code of {name} ?", "answers": [answer], "ctxs": ctxs})
    return rows


def reader_training(root: Path, s: dict, texts: list[str], rng, vocab: list[str]) -> dict:
    from odqa.common.settings import from_flat
    from odqa.reader.args import LoopArgs, ReaderArgs, ReaderInitArgs
    from odqa.reader.fid_train import train_reader
    from odqa.reader.t5_init import init_reader
    init = root / "reader-init"
    init_reader(texts, init, ReaderInitArgs(shape=s["reader"], vocab_size=s["reader_vocab"]))
    data = root / "fid-train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in fid_examples(max(40, 8 * s["batch"]), s["train_k"], rng, vocab)))
    out = {"init": init}
    for name, zero in (("ZeRO-2 bf16", {"zero_stage": 2}), ("ZeRO-3 + CPU offload", {"zero_stage": 3, "offload": True})):
        run = root / f"reader-{zero['zero_stage']}"
        loop = from_flat(LoopArgs, {"out_dir": str(run), "max_steps": s["steps"], "batch_size": s["batch"], "lr": 1e-3,
                                    "warmup_steps": 1, "eval_steps": s["steps"], "save_steps": s["steps"], "log_steps": 1,
                                    "precision": "bf16", **zero})
        args = from_flat(ReaderArgs, {"model": str(init), "train_file": [str(data)], "validation_percent": 20.0,
                                      "k": s["train_k"], "max_validation_examples": 8})
        start = time.perf_counter()
        train_reader(args, loop)
        seconds = time.perf_counter() - start
        history = json.loads((run / "trainer_state.json").read_text())["history"]
        losses = [h["loss"] for h in history if "loss" in h]
        out[name] = {"first loss": losses[0], "last loss": losses[-1], "steps/s": s["steps"] / seconds}
    return out


def generation(init: Path, s: dict, rng, vocab: list[str], device: str) -> dict:
    from odqa.reader.args import ReaderSettings
    from odqa.reader.fid_data import FiDExample
    from odqa.reader.read import generate, load_reader
    model, tokenizer = load_reader(init, device)
    out = {}
    for k in s["read_ks"]:
        rows = fid_examples(s["read_questions"], k, rng, vocab)
        examples = [FiDExample(r["id"], r["question"], r["answers"], [(c["title"], c["text"]) for c in r["ctxs"]])
                    for r in rows]
        settings = ReaderSettings(batch_size=s["read_batch"], max_new_tokens=8, decoding="free")
        generate(model, tokenizer, examples[:s["read_batch"]], [k], settings, device)   # warm
        start = time.perf_counter()
        answers = generate(model, tokenizer, examples, [k], settings, device)[k]
        out[f"k={k}"] = {"q/s": len(examples) / (time.perf_counter() - start), "answers": len(answers)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (what the suite runs)")
    p.add_argument("--out", type=Path, default=None, help="where the run's files and gpu_check.json go (default: a "
                                                           "temporary directory, the JSON beside this script's run)")
    args = p.parse_args()
    on_gpu = not args.cpu
    if on_gpu and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device; --cpu runs the tiny sizes on the CPU")
    if on_gpu and not hasattr(faiss, "StandardGpuResources"):
        sys.exit("gpu_check: this faiss has no GPU support (pip uninstall faiss-cpu; pip install faiss-gpu, "
                 "docs/guides/scale.md)")
    s, device = SIZES["cpu" if args.cpu else "gpu"], "cuda" if on_gpu else "cpu"
    root = args.out or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    vocab = words(s["vocab_words"])
    results, checks, started = {}, [], time.perf_counter()

    def stage(name):
        print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)

    def check(what: str, ok: bool, figure: str) -> None:
        checks.append({"check": what, "figure": figure, "passed": bool(ok)})

    from odqa.retriever.args import BuildIndexArgs
    from odqa.retriever.index_build import build_index
    from odqa.retriever.phrase_dump import dump_phrases
    stage("corpus and phrase model")
    corpus = make_corpus(root, s, rng)
    model = make_phrase_model(root, s)
    stage("bf16 against float32")
    error = bf16_error(model, corpus, device)
    results["bf16 relative error"] = error
    check("bf16 phrase vectors near float32's", error < BF16_REL_ERROR, f"relative error {error:.4f}")
    stage("dump")
    start = time.perf_counter()
    summary = dump_phrases(model, corpus, root / "dump", batch_size=s["dump_batch"], device=device)
    results["dump passages/s"] = s["passages"] / (time.perf_counter() - start)
    check("every passage dumped", summary["passages"] == s["passages"], f"{summary['vectors']} vectors")
    stage("index training, accelerated and CPU")
    trained = index_training(dump_sample(root / "dump", corpus, s["queries"] + max(s["base"], s["train"])), s, on_gpu)
    results["index training"] = trained
    gap = trained["cpu"]["recall@100"] - trained["accelerated"]["recall@100"]
    check("accelerated training's recall@100 as the CPU's", gap <= RECALL_GAP,
          f"{trained['accelerated']['recall@100']:.3f} vs {trained['cpu']['recall@100']:.3f}")
    stage("build-index")
    start = time.perf_counter()
    manifest = build_index(BuildIndexArgs(dump=str(root / "dump"), out=str(root / "index"), corpus=str(corpus),
                                          factory=s["factory"], keep=s["keep"], model_filter=s["keep"] < 1,
                                          train_size=s["train"]))
    results["build-index s"] = time.perf_counter() - start
    check("index holds the kept vectors", manifest["vectors"] > 0, f"{manifest['vectors']} vectors")
    stage("whole-index search")
    queries = rng.standard_normal((s["queries"], manifest["dim"])).astype(np.float32)
    searched = whole_index_search(root / "index", queries, s, on_gpu)
    results["whole-index search"] = searched
    check("two searches of one index agree", searched["overlap@100"] >= OVERLAP, f"overlap@100 {searched['overlap@100']:.3f}")
    stage("reader training under DeepSpeed")
    texts = [" ".join(rng.choice(vocab, 12)) for _ in range(2000)] + [f"what is the code of n{i} ? the code of" for i in range(500)]
    trained_reader = reader_training(root, s, texts, rng, vocab)
    init = trained_reader.pop("init")
    results["reader training"] = trained_reader
    for name, r in trained_reader.items():
        finite = math.isfinite(r["first loss"]) and math.isfinite(r["last loss"])
        # on a GPU, 20 steps at 1e-3 bring a random t5-base's loss down; 3 tiny CPU steps need only be finite
        check(f"{name}: loss finite" + ("" if args.cpu else " and falling"),
              finite and (args.cpu or r["last loss"] < r["first loss"]), f"{r['first loss']:.3f} -> {r['last loss']:.3f}")
    stage("generation")
    results["generation"] = generation(init, s, rng, vocab, device)
    check("every question answered at every k", all(g["answers"] == s["read_questions"] for g in results["generation"].values()),
          ", ".join(f"{k}: {g['q/s']:.1f} q/s" for k, g in results["generation"].items()))

    device_name = torch.cuda.get_device_name(0) if on_gpu else "CPU (--cpu: tiny sizes)"
    report = {"device": device_name, "sizes": s, "results": results, "checks": checks,
              "seconds": time.perf_counter() - started}
    (root / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"gpu_check on {device_name}, {report['seconds']:.0f} s -> {root / 'gpu_check.json'}")
    print("| check | figure | passed |\n|---|---|---|")
    for c in checks:
        print(f"| {c['check']} | {c['figure']} | {'yes' if c['passed'] else 'NO'} |")
    print(f"dump {results['dump passages/s']:.0f} passages/s; build-index {results['build-index s']:.1f} s; index training "
          + "; ".join(f"{n} {v['train_s']:.1f} s" for n, v in results["index training"].items()) + "; search "
          + "; ".join(f"{k} {v:.0f}" for k, v in searched.items() if k.endswith("q/s")) + "; reader "
          + "; ".join(f"{n} {v['steps/s']:.2f} steps/s" for n, v in results["reader training"].items()))
    return 0 if all(c["passed"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
