"""Can a reader checkpoint learn to read? Train each given T5 on the same small lookup task with
`odqa train-reader`'s loop and print validation EM side by side.

The task is the one the tests' reader must learn: "The code of NAME is D." sits in one of k passages,
the others say "NAME likes THING.", the question asks "what is the code of NAME?" and the answer is the
digit D. NAME is one of `--names` corpus titles, THING a word of the corpus. A model that learns to copy
the digit through cross-attention gets it right; one that does not stays at chance (10%). A random-init
tiny T5 learns it in a few hundred CPU steps, so it separates "this init learns to read quickly" from
"this init has to unlearn something first", which the real questions, where even a good reader needs
thousands of steps, cannot show on a CPU.

    python scripts/probe_reader_init.py --models ~/.cache/odqa/readers/t5-tiny-init RUNS/reader/pretrain/best
"""
from __future__ import annotations

import argparse
import json
import logging
import random
import re
import tempfile
from pathlib import Path

from odqa.common.corpus import PassageStore
from odqa.common.paths import default_corpus
from odqa.common.settings import from_flat
from odqa.reader.args import LoopArgs
from odqa.reader.fid_train import ReaderArgs, train_reader


def names_and_things(corpus: Path, n_names: int) -> tuple[list[str], list[str]]:
    """One-word corpus titles to ask about and corpus words for the distractor passages."""
    store = PassageStore(corpus)
    pool = random.Random(0)
    titles = sorted({store[i]["title"] for i in range(len(store))})
    names = pool.sample([t for t in titles if re.fullmatch(r"[A-Z][a-z]+", t)], n_names)
    words = sorted({w for i in range(0, len(store), 97) for w in re.findall(r"\b[a-z]{5,}\b", store[i]["text"])})
    things = pool.sample(words, 20)
    store.close()
    return names, things


def lookup_task(names: list[str], things: list[str], n: int, k: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        name, code, gold = rng.choice(names), str(rng.randrange(10)), rng.randrange(k)
        ctxs = [{"title": "people", "score": float(k - j), "has_answer": j == gold,
                 "text": f"The code of {name} is {code}." if j == gold else
                 f"{rng.choice(names)} likes {rng.choice(things)}."} for j in range(k)]
        rows.append({"id": f"lookup-{seed}-{i}", "question": f"what is the code of {name}?", "answers": [code],
                     "ctxs": ctxs})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", required=True, help="T5 checkpoints to compare")
    p.add_argument("--corpus", type=Path, default=default_corpus())
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--names", type=int, default=12, help="how many corpus titles the questions ask about")
    p.add_argument("--train", type=int, default=4800, help="training questions")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--text-maxlength", type=int, default=64)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        names, things = names_and_things(a.corpus, a.names)  # the same for the training and validation sets
        (tmp / "train.json").write_text(json.dumps(lookup_task(names, things, a.train, a.k, seed=0)))
        (tmp / "val.json").write_text(json.dumps(lookup_task(names, things, 200, a.k, seed=1)))
        results = {}
        for i, model in enumerate(a.models):
            args = from_flat(ReaderArgs, dict(model=model, train_file=[str(tmp / "train.json")],
                                              validation_file=str(tmp / "val.json"), k=a.k, text_maxlength=a.text_maxlength,
                                              max_new_tokens=8, max_validation_examples=200))
            loop = LoopArgs(out_dir=str(tmp / f"run{i}"), batch_size=a.batch_size, lr=a.lr, max_steps=a.steps,
                            warmup_steps=min(50, a.steps // 10), eval_steps=a.eval_steps, save_steps=a.steps)
            results[model] = train_reader(args, loop)
    steps = [e["step"] for e in next(iter(results.values()))["evals"]]
    print(f"lookup task: k={a.k}, {a.train} training questions, batch {a.batch_size}, lr {a.lr}; "
          f"validation EM (200 questions) by step")
    print("| model | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---:|" * len(steps))
    for model, r in results.items():
        print(f"| {model} | " + " | ".join(f"{e['em']:.1f}" for e in r["evals"]) + " |")


if __name__ == "__main__":
    main()
