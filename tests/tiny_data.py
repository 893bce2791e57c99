"""Tiny data the tests build corpora and question sets from."""
import json
import random
from pathlib import Path

# A small world: facts planted in distinct documents, one with nested sections.
TINY_DOCS = [
    {"id": "paris", "title": "Paris", "sections": [
        {"title": "", "paragraphs": ["Paris is the capital and largest city of France.",
                                     "The Eiffel Tower was completed in 1889 for the World's Fair."]},
        {"title": "History", "paragraphs": ["The city was founded by the Parisii tribe around 250 BC."],
         "sections": [{"title": "Middle Ages", "paragraphs": ["Notre-Dame was built starting in 1163."]}]},
    ]},
    {"id": "beatles", "title": "The Beatles", "abstract": "English rock band.", "sections": [
        {"title": "", "paragraphs": ["The Beatles were an English rock band formed in Liverpool in 1960. "
                                     "Their members were John Lennon, Paul McCartney, George Harrison and Ringo Starr."]},
    ]},
    {"id": "roentgen", "title": "Wilhelm Röntgen", "sections": [
        {"title": "", "paragraphs": ["Wilhelm Conrad Röntgen won the first Nobel Prize in Physics in 1901 "
                                     "for his discovery of X-rays."]},
    ]},
    {"id": "everest", "title": "Mount Everest", "sections": [
        {"title": "", "paragraphs": ["Mount Everest is Earth's highest mountain above sea level, at 8,849 metres. "
                                     "It lies in the Mahalangur Himal range of the Himalayas."]},
    ]},
]

TINY_QUESTIONS = [
    {"id": "q0", "question": "who won the first nobel prize in physics", "answers": ["Wilhelm Conrad Röntgen"]},
    {"id": "q1", "question": "in which city was the beatles band formed", "answers": ["Liverpool"]},
    {"id": "q2", "question": "when was the eiffel tower completed", "answers": ["1889"]},
    {"id": "q3", "question": "how tall is mount everest", "answers": ["8,849 metres"]},
    {"id": "q4", "question": "who invented the telephone", "answers": ["Alexander Graham Bell"]},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


# The FiD readers' synthetic task.
CODE_NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "oscar", "peggy"]
HOBBIES = ["tea", "chess", "music", "rain"]


def code_world(n: int, k: int, seed: int) -> list[dict]:
    """'the code of NAME is D' in one of k passages, the others about hobbies; the answer is D (chance 1/10)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, code, gold = rng.choice(CODE_NAMES), str(rng.randrange(10)), rng.randrange(k)
        ctxs = [{"id": str(j), "title": "people", "score": float(k - j), "has_answer": j == gold,
                 "text": f"the code of {name} is {code} ." if j == gold else
                 f"{rng.choice(CODE_NAMES)} likes {rng.choice(HOBBIES)} ."} for j in range(k)]
        out.append({"id": f"q{i}", "question": f"what is the code of {name} ?", "answers": [code], "ctxs": ctxs})
    return out


def synthetic_dump(root: Path, passages: int, tokens: int, dim: int, seed: int = 0, chunks: int = 1,
                   shared_sides: bool = False) -> tuple[Path, Path]:
    """A corpus of `passages` and a complete dump of `tokens` random vectors a passage, in `chunks`
    chunk files: what build-index reads, without a model. `shared_sides`: one vector a token, as a
    model whose start and end are one dumps it (only "start" stored)."""
    import numpy as np

    from odqa.common.corpus import build_corpus, corpus_info
    rng = np.random.default_rng(seed)
    source = root / "passages.jsonl"
    source.write_text("".join(json.dumps({"id": f"p{i}", "title": f"Doc {i}", "text": f"text {i}"}) + "\n"
                              for i in range(passages)))
    corpus = root / "corpus"
    build_corpus([source], corpus)
    shard = root / "dump" / "shard-001-of-001"
    shard.mkdir(parents=True)
    summary = {"encoder_hash": "synthetic", "fingerprint": corpus_info(corpus)["fingerprint"], "threshold": None,
               "chunk_passages": passages, "shard": [1, 1]}
    (shard / "settings.json").write_text(json.dumps(summary))
    rows, m = np.repeat(np.arange(passages), tokens), passages * tokens
    # clustered, as phrase vectors are: an IVF's lists are then uneven, as they are in a real index
    centres = rng.standard_normal((64, dim), dtype=np.float32)
    vectors = {side: (centres[rng.integers(0, 64, m)] + 0.5 * rng.standard_normal((m, dim), dtype=np.float32)
                      ).astype(np.float16) for side in (("start",) if shared_sides else ("start", "end"))}
    columns = {**vectors, "passage_row": rows.astype(np.int64),
               "token": np.tile(np.arange(1, tokens + 1, dtype=np.int32), passages), "char_start": np.zeros(m, np.int32),
               "char_end": np.ones(m, np.int32), "filter": np.zeros(m, np.float16), "in_title": np.zeros(m, bool)}
    for c, part in enumerate(np.array_split(np.arange(passages), chunks)):
        at = slice(part[0] * tokens, (part[-1] + 1) * tokens)
        np.savez(shard / f"chunk-{c:05d}.npz", **{k: v[at] for k, v in columns.items()})
    summary.update(passages=passages, chunks=chunks, vectors=m, vectors_per_passage=tokens, dim=dim, max_span_len=20,
                   title_path=False, shared_sides=shared_sides)
    (shard / "done.json").write_text(json.dumps(summary))
    return root / "dump", corpus


def both_sides_copy(dump: Path, out: Path) -> Path:
    """A copy of a dump of shared sides (start alone stored) with both copies written, as a model of two
    sides dumps them: what an index of shared sides must answer as."""
    import numpy as np
    for shard in sorted(p for p in dump.glob("shard-*") if p.is_dir()):
        twin = out / shard.name
        twin.mkdir(parents=True)
        (twin / "settings.json").write_text((shard / "settings.json").read_text())
        (twin / "done.json").write_text(json.dumps({**json.loads((shard / "done.json").read_text()),
                                                    "shared_sides": False}))
        for chunk in sorted(shard.glob("chunk-*.npz")):
            arrays = dict(np.load(chunk))
            with open(twin / chunk.name, "wb") as f:
                np.savez(f, **arrays, end=arrays["start"])
    return out

