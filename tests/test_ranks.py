"""Stages split by rank (common/ranks.py): under torchrun with 2 processes (gloo, one thread each)
every split stage leaves the output one process leaves, byte for byte, and a stage cut short resumes
its unfinished batches only, with any number of ranks."""
import json

import numpy as np
import pytest
from loop_checks import torchrun
from tiny_data import TINY_QUESTIONS, synthetic_dump, write_jsonl
from tiny_models import make_tiny_system

from odqa.common.ranks import Ranks, split_map
from odqa.system.cli import main


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = make_tiny_system(tmp_path_factory.mktemp("ranks"))
    # enough questions for several batches a rank
    world["questions"] = write_jsonl(world["root"] / "tiny-q.jsonl",
                                     [{**q, "id": f"{q['id']}-{i}"} for i in range(3) for q in TINY_QUESTIONS])
    return world


def test_split_map_resumes_only_the_batches_it_had_not_finished(tmp_path):
    parts, calls = tmp_path / ".out.parts", []

    def square(batch, fail_at=None):
        calls.append(list(batch))
        if fail_at is not None and batch[0] == fail_at:
            raise KeyboardInterrupt   # as a kill would stop it
        return [x * x for x in batch]
    items = list(range(10))
    with pytest.raises(KeyboardInterrupt):
        split_map(lambda b: square(b, fail_at=6), items, 3, parts, key="a")
    assert sorted(p.name for p in parts.glob("batch-*")) == ["batch-0000000.json", "batch-0000001.json"]
    calls.clear()
    assert split_map(square, items, 3, parts, key="a") == [x * x for x in items]
    assert calls == [[6, 7, 8], [9]]            # the finished batches were not computed again
    assert not parts.exists()                    # merged: the parts are gone
    # parts made from other inputs are not taken for this stage's
    with pytest.raises(KeyboardInterrupt):
        split_map(lambda b: square(b, fail_at=3), items, 3, parts, key="a")
    calls.clear()
    assert split_map(lambda b: [-x for x in b], items, 3, parts, key="b") == [-x for x in items]
    assert split_map(square, [], 3, None) == []
    with pytest.raises(ValueError, match="needs a directory"):
        split_map(square, items, 3, None, ranks=Ranks(0, 2, 0))


def test_split_map_in_two_halves_gives_each_batch_its_own_preparation_and_resumes(tmp_path):
    parts, prepared = tmp_path / ".out.parts", []

    def prepare(batch):
        prepared.append(list(batch))
        return [x * x for x in batch]

    def add(batch, squares, fail_at=None):
        if batch[0] == fail_at:
            raise KeyboardInterrupt
        return [x + s for x, s in zip(batch, squares)]
    items, want = list(range(10)), [x + x * x for x in range(10)]
    assert split_map(add, items, 3, None, prepare=prepare) == want
    with pytest.raises(KeyboardInterrupt):
        split_map(lambda b, s: add(b, s, fail_at=6), items, 3, parts, key="a", prepare=prepare)
    prepared.clear()
    assert split_map(add, items, 3, parts, key="a", prepare=prepare) == want
    assert prepared == [[6, 7, 8], [9]]   # only the unfinished batches are prepared again


def _run_args(world, out):
    return ["run", "--index", str(world["index"]), "--model", str(world["phrase"]), "--reader", str(world["t5"]),
            "--out", str(out), "--questions", str(world["questions"]), "--k", "1", "3", "--corpus",
            str(world["corpus"]), "--dense-encoder", str(world["bert"]), "--batch-size", "2"]


def test_run_retrieve_and_read_under_two_ranks_write_what_one_process_writes(world, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(_run_args(world, one)) == 0
    torchrun(_run_args(world, two), nproc=2)
    made = sorted(p.name for p in one.iterdir() if p.suffix in (".json", ".jsonl", ".md") and p.name != "run_args.json")
    assert {"retrieval-tiny-q.json", "pred-tiny-q-k3.jsonl", "bm25-tiny-q.json", "dense-tiny-q.json"} <= set(made)
    for name in made:
        assert (two / name).read_bytes() == (one / name).read_bytes(), name
    assert not list(two.glob(".*.parts"))    # merged and removed

    phrase = ["retrieve", "--retriever", "phrase", "--index", str(world["index"]), "--model", str(world["phrase"]),
              "--corpus", str(world["corpus"]), "--questions", str(world["questions"]), "--k", "3", "--batch-size", "2"]
    assert main([*phrase, "--out", str(one / "phrase.json")]) == 0
    torchrun([*phrase, "--out", str(two / "phrase.json")], nproc=2)
    assert (two / "phrase.json").read_bytes() == (one / "phrase.json").read_bytes()

    read = ["read", "--model", str(world["t5"]), "--input", str(one / "phrase.json"), "--k", "3", "--batch-size", "2"]
    assert main([*read, "--out", str(one / "pred.jsonl")]) == 0
    torchrun([*read, "--out", str(two / "pred.jsonl")], nproc=2)
    assert (two / "pred.jsonl").read_bytes() == (one / "pred.jsonl").read_bytes()


def test_a_retrieval_cut_short_resumes_its_batches_under_two_ranks(world, tmp_path, monkeypatch):
    from odqa.retriever.searcher import Searcher
    args = ["retrieve", "--retriever", "phrase", "--index", str(world["index"]), "--model", str(world["phrase"]),
            "--corpus", str(world["corpus"]), "--questions", str(world["questions"]), "--k", "3", "--batch-size", "2"]
    assert main([*args, "--out", str(tmp_path / "whole.json")]) == 0
    search, searched = Searcher.search, []

    def killed_after_three(self, questions, *a, **kw):
        if len(searched) == 3:
            raise KeyboardInterrupt
        searched.append(questions)
        return search(self, questions, *a, **kw)
    monkeypatch.setattr(Searcher, "search", killed_after_three)
    out = tmp_path / "cut.json"
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--out", str(out)])
    assert not out.exists() and len(list((tmp_path / ".cut.json.parts").glob("batch-*"))) == 3
    done = torchrun([*args, "--out", str(out)], nproc=2, quiet=False)
    assert "already done; resuming" in done.stderr
    assert out.read_bytes() == (tmp_path / "whole.json").read_bytes()
    assert json.loads(out.read_text())[0]["id"] == json.loads((tmp_path / "whole.json").read_text())[0]["id"]


def test_dump_phrases_under_two_ranks_builds_the_index_one_process_builds(world, tmp_path):
    from search_helpers import index_of
    args = ["dump-phrases", "--model", str(world["phrase"]), "--corpus", str(world["corpus"]), "--chunk-passages", "2"]
    torchrun([*args, "--out", str(tmp_path / "dump2")], nproc=2)
    assert sorted(p.name for p in (tmp_path / "dump2").iterdir()) == ["shard-001-of-002", "shard-002-of-002"]
    assert main([*args, "--out", str(tmp_path / "dump1")]) == 0
    for n in (1, 2):
        index_of(tmp_path / f"dump{n}", tmp_path / f"index{n}", world["corpus"], factory="Flat")
    for name in ("start.faiss", "end.faiss"):
        assert (tmp_path / "index2" / name).read_bytes() == (tmp_path / "index1" / name).read_bytes(), name
    with np.load(tmp_path / "index1" / "meta.npz") as a, np.load(tmp_path / "index2" / "meta.npz") as b:
        assert all(np.array_equal(a[k], b[k]) for k in a.files)
    assert main([*args, "--out", str(tmp_path / "dump3"), "--shard", "1/2"]) == 0   # a scheduler's process
    assert sorted(p.name for p in (tmp_path / "dump3").iterdir()) == ["shard-001-of-002"]


def test_the_dense_baseline_encodes_the_corpus_split_by_rank_into_the_same_index(world, tmp_path):
    import shutil
    for n in (1, 2):   # a corpus of its own each: the dense index is built inside the corpus directory
        shutil.copytree(world["corpus"], tmp_path / f"corpus{n}")
    args = ["retrieve", "--retriever", "dense", "--model", str(world["bert"]), "--questions", str(world["questions"]),
            "--k", "3"]
    assert main([*args, "--corpus", str(tmp_path / "corpus1"), "--out", str(tmp_path / "one.json")]) == 0
    torchrun([*args, "--corpus", str(tmp_path / "corpus2"), "--out", str(tmp_path / "two.json")], nproc=2)
    built = [tmp_path / f"corpus{n}" / "dense-bert" / "passages.faiss" for n in (1, 2)]
    assert built[0].read_bytes() == built[1].read_bytes()
    assert (tmp_path / "two.json").read_bytes() == (tmp_path / "one.json").read_bytes()
    assert not list((tmp_path / "corpus2").glob(".*"))    # no parts or vectors left behind


@pytest.mark.parametrize("shared_sides", [False, True])
def test_build_index_under_two_ranks_writes_the_codes_one_process_writes(tmp_path, shared_sides):
    """Rank 0 trains the start side's quantisers and rank 1 the end side's (nothing, when the two are one);
    each rank encodes every other chunk into the codes and lists files, at its vectors' ids: every file
    of the index is the one a single process writes."""
    dump, corpus = synthetic_dump(tmp_path, 600, 10, 32, chunks=4, shared_sides=shared_sides)
    args = ["build-index", "--dump", str(dump), "--corpus", str(corpus), "--keep", "1", "--factory", "OPQ8,IVF16,PQ8"]
    # one process under the same launcher: one thread, as each rank has (faiss's k-means sums in the
    # order its threads give)
    torchrun([*args, "--out", str(tmp_path / "one")], nproc=1)
    torchrun([*args, "--out", str(tmp_path / "two")], nproc=2)
    files = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert {"start.codes.npy", "start.lists.npy", "start.order.npy"} <= set(files)
    assert ("end.codes.npy" in files) is not shared_sides
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == files
    for name in files:
        if name != "manifest.json":
            assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert not list(tmp_path.glob(".two*"))     # nothing of the ranks' left beside it


def test_build_doc_index_under_two_ranks_writes_the_index_one_process_writes(world, tmp_path):
    from odqa.retriever.args import DocEncoderConfig
    from odqa.retriever.doc_encoder import DocEncoder
    from odqa.retriever.lm import load_tokenizer
    DocEncoder(DocEncoderConfig(encoder=str(world["bert"]), max_doc_tokens=64)).save_pretrained(
        tmp_path / "doc", load_tokenizer(world["bert"]))
    args = ["build-doc-index", "--model", str(tmp_path / "doc"), "--corpus", str(world["corpus"])]
    torchrun([*args, "--out", str(tmp_path / "one")], nproc=1)
    torchrun([*args, "--out", str(tmp_path / "two")], nproc=2)
    assert (tmp_path / "two" / "docs.faiss").read_bytes() == (tmp_path / "one" / "docs.faiss").read_bytes()
    assert not list(tmp_path.glob(".*"))


def test_supervise_under_two_ranks_writes_what_one_process_writes(tiny_corpus, tiny_questions, tmp_path):
    """Each rank finds the answer-bearing passages of its share of the questions; the BM25 and answer
    indexes the ranks share are built once, by rank 0."""
    args = ["supervise", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus), "--validation-percent", "50"]
    torchrun([*args, "--out", str(tmp_path / "two")], nproc=2)
    assert (tiny_corpus / "answer-index" / "manifest.json").exists() and (tiny_corpus / "bm25").is_dir()
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    for name in ("train.jsonl", "validation.jsonl", "stats.json"):
        assert (tmp_path / "two" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert (tmp_path / "one" / "train.jsonl").stat().st_size > 0
    assert not list((tmp_path / "two").glob(".*"))


MINING = '''
import json, sys
from odqa.common.questions import load_questions
from odqa.common.ranks import current
from odqa.common.settings import from_flat
from odqa.retriever.args import QueryTrainArgs
from odqa.retriever.query_train import mine_candidates
from odqa.retriever.searcher import Searcher
index, model, corpus, questions, out = sys.argv[1:]
searcher = Searcher.open(index, model, corpus, trained=True)
encoded = []
encode = searcher.encode
searcher.encode = lambda texts: encoded.extend(texts) or encode(texts)
args = from_flat(QueryTrainArgs, {"model": model, "index": index, "corpus": corpus, "out_dir": out, "top_k": 20,
                                   "label": "passage"})
found = mine_candidates(searcher, load_questions(questions), args, 0, parts=out + "/.mine.parts")
with open(f"{out}/rank{current().rank}.json", "w") as f:
    json.dump({"found": found, "encoded": encoded}, f)
'''


def test_train_query_mining_under_two_ranks_gives_one_processs_candidates_each_rank_encoding_its_share(world, tmp_path):
    """train-query's candidates: each rank encodes and searches only its share of the batches of 64
    questions (once, every rank encoded every question), and every rank gets the candidates one process
    mines."""
    import subprocess
    import sys
    questions = write_jsonl(tmp_path / "q.jsonl", [{**q, "id": f"{q['id']}-{i}"} for i in range(30) for q in TINY_QUESTIONS])
    script = tmp_path / "mine.py"
    script.write_text(MINING)
    results = {}
    for nproc in (1, 2):
        out = tmp_path / f"n{nproc}"
        out.mkdir()
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
                               str(script), str(world["index"]), str(world["phrase"]), str(world["corpus"]),
                               str(questions), str(out)], env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results[nproc] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
    n = 30 * len(TINY_QUESTIONS)
    assert n > 64 * 2                                       # several batches a rank
    one, two = results[1][0], results[2]
    assert two[0]["found"] == two[1]["found"] == one["found"]
    assert len(one["encoded"]) == n
    assert sorted(two[0]["encoded"] + two[1]["encoded"]) == sorted(one["encoded"])   # each question once in all
    assert 0 < len(two[0]["encoded"]) < n and 0 < len(two[1]["encoded"]) < n


def test_a_killed_build_index_resumes_and_writes_the_codes_of_a_build_never_stopped(tmp_path, monkeypatch):
    """A build stopped in its third chunk keeps its trained quantisers and the chunks it encoded (once, a
    restart started over); the next run trains nothing, encodes only the chunks left, and every file of
    the index is that of a build that never stopped."""
    from odqa.retriever import index_build
    from odqa.retriever.ivfpq_codes import IVFPQCodes
    dump, corpus = synthetic_dump(tmp_path, 600, 10, 32, chunks=4)
    args = ["-q", "build-index", "--dump", str(dump), "--corpus", str(corpus), "--keep", "1", "--factory", "OPQ8,IVF16,PQ8"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    encode, train = IVFPQCodes.encode, index_build._train
    calls = {"encode": 0, "train": 0}

    def counted_encode(index, x, stop_at=None):
        calls["encode"] += 1
        if calls["encode"] == stop_at:
            raise KeyboardInterrupt    # as a kill would stop it
        return encode(index, x)
    monkeypatch.setattr(index_build, "_train", lambda *a: calls.__setitem__("train", calls["train"] + 1) or train(*a))
    monkeypatch.setattr(IVFPQCodes, "encode", staticmethod(lambda index, x: counted_encode(index, x, stop_at=5)))
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--out", str(tmp_path / "resumed")])
    assert calls == {"encode": 5, "train": 2} and not (tmp_path / "resumed").exists()
    (work,) = tmp_path.glob(".resumed.build-*")
    assert sorted(p.name for p in (work / "done").iterdir()) == ["0", "1"]    # two sides a chunk: 2 chunks done
    calls.update(encode=0, train=0)
    monkeypatch.setattr(IVFPQCodes, "encode", staticmethod(lambda index, x: counted_encode(index, x)))
    assert main([*args, "--out", str(tmp_path / "resumed")]) == 0
    assert calls == {"encode": 4, "train": 0}                                 # chunks 2 and 3, both sides
    files = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert sorted(p.name for p in (tmp_path / "resumed").iterdir()) == files
    for name in files:
        if name != "manifest.json":
            assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert not list(tmp_path.glob(".resumed*"))   # the work directory went with the build
