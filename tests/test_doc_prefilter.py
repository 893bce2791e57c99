"""DHR's document pre-filter on a tiny corpus of people, each a document of three sections:
training the document encoder, the document index and its refusals, phrase search restricted to
the top documents, the reranking formula and lambda tuning."""
import json
import random
import shutil

import numpy as np
import pytest
import torch
from loop_checks import (
    assert_reported,
    assert_two_processes_train_as_one_with_twice_the_accumulation,
    assert_zero3_trains_like_zero2,
    losses,
    without_dropout,
)
from search_helpers import index_of, searcher_of
from tiny_data import write_jsonl
from tiny_models import make_tiny_bert

from odqa.common.corpus import DocumentTable, build_corpus
from odqa.common.io import InputError
from odqa.common.settings import from_flat
from odqa.retriever.args import DocEncoderConfig, PhraseModelConfig
from odqa.retriever.doc_encoder import DocEncoder, doc_summary, encode_questions
from odqa.retriever.doc_index import DocRetriever, build_doc_index
from odqa.retriever.doc_train import DocTrainArgs, train_doc
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_dump import dump_phrases
from odqa.retriever.phrase_model import DensePhraseModel
from odqa.retriever.rerank import Candidates, combined
from odqa.retriever.searcher import Searcher
from odqa.retriever.supervise import supervise
from odqa.retriever.tune_lambda import tune_lambda

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"]
CITIES = ["paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "accra", "hanoi"]
FILLER = "the weather was mild and the river ran slowly past old mills and quiet farms".split()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("dhr")
    rng = random.Random(0)
    filler = lambda: " ".join(rng.choice(FILLER) for _ in range(8)) + " ."  # noqa: E731
    docs = [{"id": n, "title": n, "sections": [
        {"title": "", "paragraphs": [f"{n} is a person . {filler()}"]},
        {"title": "Early life", "paragraphs": [f"{filler()} {n} was born in {c} . {filler()}"]},
        {"title": "Career", "paragraphs": [filler()]}]} for n, c in zip(NAMES, CITIES)]
    corpus = root / "corpus"
    build_corpus([write_jsonl(root / "docs.jsonl", docs)], corpus)
    questions = [{"id": n, "question": f"where was {n} born", "answers": [c]} for n, c in zip(NAMES, CITIES)]
    write_jsonl(root / "questions.jsonl", questions)
    supervise([str(root / "questions.jsonl")], corpus, root / "sup", validation_percent=0)
    shutil.copy(root / "sup" / "train.jsonl", root / "sup" / "validation.jsonl")
    texts = [p for d in docs for s in d["sections"] for p in s["paragraphs"]] + NAMES + ["early life career"]
    bert = make_tiny_bert(root / "bert", texts + [q["question"] for q in questions])
    # An untrained phrase model is enough here: the pre-filter's guarantees hold for any scores.
    tokenizer = load_tokenizer(bert)
    DensePhraseModel(PhraseModelConfig(encoder=str(bert), max_passage_tokens=64)).save_pretrained(root / "phrase", tokenizer)
    dump_phrases(root / "phrase", corpus, root / "dump", chunk_passages=8)
    index_of(root / "dump", root / "index", corpus)
    return {"root": root, "corpus": corpus, "bert": bert, "questions": [q["question"] for q in questions]}


@pytest.fixture(scope="module")
def doc_model(world):
    """The document encoder after train-doc (abstract negatives), and its index."""
    root = world["root"]
    summary = train_doc(from_flat(DocTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"),
                                     validation_file=str(root / "sup" / "validation.jsonl"), corpus=str(world["corpus"]),
                                     out_dir=str(root / "doc"), encoder=str(world["bert"]), epochs=20, batch_size=5,
                                     lr=2e-3, max_doc_tokens=64, report_to="tensorboard")))
    build_doc_index(root / "doc" / "best", world["corpus"], root / "doc-index")
    return {"dir": root / "doc" / "best", "index": root / "doc-index", "summary": summary}


def test_training_reports_to_tensorboard(world, doc_model):
    assert_reported(world["root"] / "doc", "Top-20")


def test_document_summary_is_title_tree_and_abstract(world):
    table = DocumentTable(world["corpus"])
    tree, abstract = doc_summary(table.docs[table.row_of["alice"]])
    assert tree == "alice, Early life, Career"
    assert abstract.startswith("alice is a person .")
    assert [len(table.passage_rows(d)) for d in range(len(table))] == [3] * len(NAMES)


def test_train_doc_learns_which_document_answers(doc_model):
    s = doc_model["summary"]
    assert s["with_negatives"] == len(NAMES)  # every question got an abstract negative
    assert s["best_top20"] == 100.0
    assert s["validation"][-1]["Top-1"] >= 80.0, s["validation"][-1]  # chance is 10


def test_train_doc_refuses_a_supervision_passage_missing_from_the_corpus(world, tmp_path):
    """Only the supervision's passage ids are mapped to rows; one the corpus lacks is named."""
    root = world["root"]
    lines = (root / "sup" / "train.jsonl").read_text().splitlines()
    bad = json.loads(lines[0])
    bad["passage_id"] = "nowhere#7"
    (tmp_path / "train.jsonl").write_text("\n".join(lines[1:] + [json.dumps(bad)]) + "\n")
    with pytest.raises(InputError, match="'nowhere#7' is not in the corpus"):
        train_doc(from_flat(DocTrainArgs, dict(train_file=str(tmp_path / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
                               corpus=str(world["corpus"]), out_dir=str(tmp_path / "out"), encoder=str(world["bert"]),
                               epochs=1, batch_size=5, max_doc_tokens=64)))


def test_train_doc_resumes_with_the_same_losses(world, tmp_path, monkeypatch):
    from odqa.common import trainer as train_loop
    root = world["root"]

    def args(out, resume=False):
        return from_flat(DocTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"), validation_file=str(root / "sup" / "validation.jsonl"),
                            corpus=str(world["corpus"]), out_dir=str(out), encoder=str(world["bert"]), epochs=2,
                            batch_size=5, lr=1e-3, max_doc_tokens=64, save_steps=1, resume=resume))
    train_doc(args(tmp_path / "full"))
    full = train_loop.read_json(tmp_path / "full" / "checkpoint" / "trainer_state.json")["history"]

    real_step = train_loop.torch.optim.AdamW.step
    calls = {"n": 0}

    def crash_after_three(self, *a, **k):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return real_step(self, *a, **k)
    monkeypatch.setattr(train_loop.torch.optim.AdamW, "step", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        train_doc(args(tmp_path / "cut"))
    monkeypatch.setattr(train_loop.torch.optim.AdamW, "step", real_step)
    train_doc(args(tmp_path / "cut", resume=True))
    resumed = train_loop.read_json(tmp_path / "cut" / "checkpoint" / "trainer_state.json")["history"]
    assert [h["step"] for h in resumed] == [h["step"] for h in full]
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in full], rel=1e-4)


def _doc_run(world, encoder):
    root = world["root"]

    def run(out, **loop):
        train_doc(from_flat(DocTrainArgs, dict(train_file=str(root / "sup" / "train.jsonl"),
                               validation_file=str(root / "sup" / "validation.jsonl"), corpus=str(world["corpus"]),
                               out_dir=str(out), encoder=str(encoder), epochs=2, batch_size=2, lr=1e-3, warmup_steps=2,
                               max_doc_tokens=64, **loop)))
        return losses(out), DocEncoder.from_pretrained(out / "last").state_dict()
    return run


def test_train_doc_at_zero3_trains_like_zero2(world, tmp_path):
    assert_zero3_trains_like_zero2(_doc_run(world, world["bert"]), tmp_path)


def test_train_doc_in_two_processes_trains_as_one_with_twice_the_accumulation(world, tmp_path):
    root, encoder = world["root"], without_dropout(world["bert"], tmp_path / "bert")

    def command(out):
        return ["train-doc", "--train-file", str(root / "sup" / "train.jsonl"), "--validation-file",
                str(root / "sup" / "validation.jsonl"), "--corpus", str(world["corpus"]), "--out", str(out),
                "--encoder", str(encoder), "--epochs", "2", "--batch-size", "2", "--lr", "1e-3", "--warmup-steps", "1",
                "--max-doc-tokens", "64", "--backend", "deepspeed"]
    assert_two_processes_train_as_one_with_twice_the_accumulation(command, tmp_path,
                                                                  lambda d: DocEncoder.from_pretrained(d).state_dict())


def test_a_document_index_of_another_encoder_is_refused(world, doc_model, tmp_path):
    other = DocEncoder(DocEncoderConfig(encoder=str(make_tiny_bert(tmp_path / "other", ["x"], seed=1)), max_doc_tokens=64))
    other.save_pretrained(tmp_path / "other-doc", load_tokenizer(tmp_path / "other"))
    with pytest.raises(InputError, match="another document encoder"):
        DocRetriever(doc_model["index"], tmp_path / "other-doc", world["corpus"])
    with pytest.raises(InputError, match="not a document index"):
        DocRetriever(tmp_path, doc_model["dir"], world["corpus"])


def test_prefilter_never_returns_a_passage_outside_the_chosen_documents(world, doc_model):
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    table = docs.table
    for lam in (0.0, 1.0):
        searcher = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs,
                            top_docs=2, lam=lam)
        chosen, _ = docs.search(world["questions"], 2)
        for unit in ("passage", "document"):
            for q, allowed, r in zip(world["questions"], chosen, searcher.search(world["questions"], k=5, unit=unit)):
                allowed = {table.docs[d]["id"] for d in allowed}
                doc_of = {p["id"]: p["doc_id"] for p in searcher.artifacts.store}
                assert r.phrases and {doc_of[p.passage_id] for p in r.phrases} <= allowed, q
                if unit == "passage":
                    assert {table.docs[table.doc_of_passage[h.row]]["id"] for h in r.hits} <= allowed
                    assert len(r.hits) == 5  # the two documents' 6 passages hold at least 5 with a phrase
                else:
                    assert {h.unit.id for h in r.hits} <= allowed


def test_all_documents_and_lambda_zero_rank_as_no_prefilter(world, doc_model):
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    plain = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"])
    filtered = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs,
                        top_docs=len(NAMES), lam=0.0)
    for unit in ("passage", "document"):
        a, b = plain.search(world["questions"], k=8, unit=unit), filtered.search(world["questions"], k=8, unit=unit)
        for x, y in zip(a, b):
            assert [h.unit.id for h in x.hits] == [h.unit.id for h in y.hits]
            assert [h.score for h in x.hits] == pytest.approx([h.score for h in y.hits])


def test_a_search_given_its_queries_made_apart_finds_what_it_finds_alone(world, doc_model):
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    searcher = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs,
                           top_docs=2, lam=1.0)
    questions = world["questions"]
    queries = searcher.queries(questions)
    assert (queries.doc_rows == docs.search(questions, 2)[0]).all()
    for unit in ("passage", "document"):
        alone, given = searcher.search(questions, k=5, unit=unit), searcher.search(questions, k=5, unit=unit,
                                                                                 queries=queries)
        assert [[(h.unit.id, h.score, h.phrase) for h in r.hits] for r in alone] == \
            [[(h.unit.id, h.score, h.phrase) for h in r.hits] for r in given]
        assert [r.answer for r in alone] == [r.answer for r in given]
    with pytest.raises(ValueError, match="other questions"):
        searcher.search(questions[::-1], k=5, queries=queries)


@pytest.mark.parametrize("factory", ["Flat", "IVF4,PQ4"])
def test_prefiltered_search_is_exact_inside_the_chosen_documents(world, doc_model, factory):
    """Every passage of the top documents comes back, scored as its best span within the cap over all
    its indexed tokens (brute force from the index's vectors), best first; with IVF too, where a MIPS
    probing one list of four would miss most of them."""
    index = world["root"] / f"index-{factory}"
    if not index.exists():
        index_of(world["root"] / "dump", index, world["corpus"], factory=factory)
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    searcher = searcher_of(index, world["root"] / "phrase", world["corpus"], doc_index=docs, nprobe=1,
                        top_docs=3, lam=0.0, max_answer_tokens=4, answer_filter=False)
    chosen, _ = docs.search(world["questions"], 3)
    q_start, q_end = searcher.encode(world["questions"])
    a = searcher.artifacts
    tokens = a.index.meta["token"].astype(np.int32)
    for qi, result in enumerate(searcher.search(world["questions"], k=100, unit="passage")):
        want = {}
        for d in chosen[qi]:
            for row in docs.table.passage_rows(d):
                ids = np.arange(a.passage_vec[row], a.passage_vec[row + 1])
                s = a.index.vectors("start", ids) @ q_start[qi]
                e = a.index.vectors("end", ids) @ q_end[qi]
                gap = tokens[ids][None, :] - tokens[ids][:, None]
                want[row] = np.where((gap >= 0) & (gap < 4), s[:, None] + e[None, :], -np.inf).max()
        got = [(h.row, h.score) for h in result.hits]
        assert sorted(row for row, _ in got) == sorted(want)
        assert [score for _, score in got] == pytest.approx([want[row] for row, _ in got], rel=1e-5)
        assert [score for _, score in got] == sorted((score for _, score in got), reverse=True)


def test_faiss_lists_are_never_filled_on_the_cpu(world, doc_model):
    """An IVF-PQ index opens with faiss's lists empty and its codes memory-mapped: the pre-filtered search
    scores the codes by id, and a whole-index search reads them list by list; neither fills faiss's
    lists, and the whole-index search finds what the codes score."""
    index = world["root"] / "index-IVF4,PQ4"
    if not index.exists():
        index_of(world["root"] / "dump", index, world["corpus"], factory="IVF4,PQ4")
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    searcher = searcher_of(index, world["root"] / "phrase", world["corpus"], doc_index=docs, nprobe=4, top_docs=3)
    ix, n = searcher.artifacts.index, searcher.artifacts.index.manifest["vectors"]
    assert searcher.search(world["questions"], k=3)[0].hits
    assert ix._faiss["start"].ntotal == 0 and ix._faiss["end"].ntotal == 0
    codes = ix._codes.values()
    assert all(isinstance(c.codes, np.memmap) and isinstance(c.list_of, np.memmap) and isinstance(c.order, np.memmap)
               for c in codes)
    q = np.random.default_rng(0).standard_normal((2, ix.manifest["dim"])).astype(np.float32)
    scores, ids = ix.search("start", q, 5)     # every list probed: exact over the codes
    assert ix._faiss["start"].ntotal == 0 and ix._faiss["end"].ntotal == 0
    every = ix.scores("start", np.arange(n), q[0])
    assert sorted(ids[0]) == sorted(np.argsort(-every)[:5])
    np.testing.assert_allclose(scores[0], every[ids[0]], rtol=1e-4, atol=1e-4)
    assert ix.search("start", q, 5)[1].tolist() == ids.tolist()


def test_an_index_of_version_2_holds_its_codes_once_too(world, tmp_path):
    """An IVF-PQ written before version 3 (the codes inside the .faiss files, with their ids) opens with
    its lists emptied, as version 3 opens, and searches as the version 3 index does (its list order made
    in memory, as it has none on disk)."""
    import json
    import shutil

    import faiss

    from odqa.retriever.ivfpq_codes import IVFPQCodes
    from odqa.retriever.phrase_index import PhraseIndex
    index = world["root"] / "index-IVF4,PQ4"
    if not index.exists():
        index_of(world["root"] / "dump", index, world["corpus"], factory="IVF4,PQ4")
    old = tmp_path / "v2"
    shutil.copytree(index, old)
    manifest = json.loads((old / "manifest.json").read_text())
    for side in ("start", "end"):
        filled = faiss.read_index(str(old / f"{side}.faiss"))
        IVFPQCodes.load(filled, old, side, manifest["vectors"]).fill(filled)
        faiss.write_index(filled, str(old / f"{side}.faiss"))
        for name in ("codes", "lists", "order"):
            (old / f"{side}.{name}.npy").unlink()
    manifest["version"] = 2
    del manifest["files"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    v2, v3 = PhraseIndex(old, nprobe=2), PhraseIndex(index, nprobe=2)
    assert v2._faiss["start"].ntotal == v2._faiss["end"].ntotal == 0
    q = np.random.default_rng(1).standard_normal((3, manifest["dim"])).astype(np.float32)
    ids = np.arange(manifest["vectors"])
    for side in ("start", "end"):
        np.testing.assert_array_equal(v2.scores(side, ids, q[0]), v3.scores(side, ids, q[0]))
        np.testing.assert_array_equal(v2.search(side, q, 7)[1], v3.search(side, q, 7)[1])
    assert v2._faiss["start"].ntotal == 0      # searched from the codes, as version 3 is


def test_question_vectors_come_back_in_the_questions_order(world, doc_model):
    """Both question encoders batch questions by length; each vector is still its own question's."""
    questions = ["where was alice born, in which city of them all", "who", "where was bob born", "where"]
    searcher = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"])
    searcher.batch_size = 2
    q_start, q_end = searcher.encode(questions)
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    q_doc = encode_questions(docs.model, docs.tokenizer, questions, batch_size=2)
    for i, q in enumerate(questions):
        alone = searcher.encode([q])
        np.testing.assert_allclose(q_start[i], alone[0][0], atol=1e-5)
        np.testing.assert_allclose(q_end[i], alone[1][0], atol=1e-5)
        np.testing.assert_allclose(q_doc[i], encode_questions(docs.model, docs.tokenizer, [q])[0], atol=1e-5)


def test_rerank_sorts_by_standardised_passage_plus_lambda_document_score(world, doc_model):
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    # answer_depth 1: the extractive answer is the first passage's phrase, not a vote
    base = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs, top_docs=3, lam=0.0,
                    answer_depth=1)
    lam = 1.5
    # the lambda = 0 pool of POOL passages, reranked by hand, is what the lambda searcher returns
    from odqa.retriever.prefilter import POOL
    pool = base.search(world["questions"], k=POOL, unit="passage")
    reranked = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs, top_docs=3,
                        lam=lam, answer_depth=1).search(world["questions"], k=4, unit="passage")
    from dataclasses import replace
    for p, r in zip(pool, reranked):
        c = Candidates(np.array([h.parts["passage_score"] for h in p.hits]), np.array([h.parts["doc_z"] for h in p.hits]))
        final = combined(c, lam)
        order = np.argsort(-final, kind="stable")[:4]
        assert [p.hits[i].unit.id for i in order] == [h.unit.id for h in r.hits]
        assert [h.score for h in r.hits] == pytest.approx(final[order].tolist())
        # the extractive answer follows the final ranking: the first passage's phrase, not the top phrase
        assert r.extractive == replace(r.hits[0].phrase, support=1.0)
        assert p.extractive == replace(p.phrases[0], support=1.0)   # without a rerank they are one phrase
    assert any(r.phrases[0] != r.hits[0].phrase for r in reranked)


def test_rerank_adds_the_passages_standardised_bm25_score(world, doc_model, tmp_path):
    """With a BM25 weight mu the final score is z(passage) + lambda z(document) + mu z(BM25 of the
    passage), over the same pool; the weight is read from lambda.json when not given, and a file tuned
    before the term existed reads as 0."""
    from odqa.common.io import write_json
    from odqa.retriever.bm25 import BM25Index
    from odqa.retriever.rerank import standardise
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    make = lambda **kw: searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"],  # noqa: E731
                                 doc_index=docs, top_docs=3, **kw)
    lam, mu = 0.5, 2.0
    pool = make(lam=0.0, bm25_weight=0.0).search(world["questions"], k=100, unit="passage")
    reranked = make(lam=lam, bm25_weight=mu).search(world["questions"], k=4, unit="passage")
    bm25 = BM25Index.open(world["corpus"])
    moved = 0
    for q, p, r in zip(world["questions"], pool, reranked):
        rows = [h.row for h in p.hits]
        c = Candidates(np.array([h.parts["passage_score"] for h in p.hits]), np.array([h.parts["doc_z"] for h in p.hits]),
                       bm25_z=standardise(bm25.scores(q)[rows]))
        final = combined(c, lam, mu)
        order = np.argsort(-final, kind="stable")[:4]
        assert [p.hits[i].unit.id for i in order] == [h.unit.id for h in r.hits]
        assert [h.score for h in r.hits] == pytest.approx(final[order].tolist())
        assert [h.parts["bm25_z"] for h in r.hits] == pytest.approx(c.bm25_z[order].tolist())
        moved += order.tolist() != np.argsort(-combined(c, lam), kind="stable")[:4].tolist()
    assert moved  # the BM25 term changed some question's ranking
    # A question of stop words only has no BM25 score: the term adds nothing, and nothing fails.
    alone = make(lam=lam, bm25_weight=mu).search(["to be or not to be"], k=4, unit="passage")[0].hits
    assert alone and all(h.parts["bm25_z"] == 0 for h in alone)
    # A weight that dwarfs the other terms ranks the pool by BM25 alone.
    for q, r in zip(world["questions"], make(lam=lam, bm25_weight=1e6).search(world["questions"], k=4)):
        scores = bm25.scores(q)[[h.row for h in r.hits]]
        assert (np.diff(scores) <= 1e-9).all()
    index_dir = tmp_path / "di"
    shutil.copytree(doc_model["index"], index_dir)
    tuned = DocRetriever(index_dir, doc_model["dir"], world["corpus"])
    write_json(index_dir / "lambda.json", {"lambda": lam})
    assert searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"],
                       doc_index=tuned).prefilter.config.bm25_weight == 0.0
    write_json(index_dir / "lambda.json", {"lambda": lam, "bm25_weight": mu})
    searcher = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=tuned, top_docs=3)
    assert (searcher.prefilter.config.lam, searcher.prefilter.config.bm25_weight) == (lam, mu)
    assert isinstance(searcher.artifacts.bm25().model.scores["data"], np.memmap)   # read from disk as the rerank asks
    assert searcher.search(world["questions"], k=4, unit="passage") == reranked
    with pytest.raises(InputError, match="pre-filter"):
        searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], bm25_weight=mu)


def test_tuning_picks_the_planted_bm25_weight_and_prefers_none_on_ties():
    """Question A's answer is lifted only by mu >= 0.3 (its BM25 z is high), question B's is kept first
    only by lambda <= 0.5; with BM25 z carrying no signal, the tie goes to mu = 0."""
    a = Candidates(np.array([2.0, 1.0]), np.zeros(2), np.array([False, True]), bm25_z=np.array([-1 / 0.25, 1 / 0.25]))
    b = Candidates(np.array([2.0, 1.0]), np.array([-1 / 0.55, 1 / 0.55]), np.array([True, False]), bm25_z=np.zeros(2))
    result = tune_lambda([a, b], k=1, bm25_grid=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5))
    assert (result["lambda"], result["bm25_weight"], result["best"]) == (0.0, 0.3, 100.0)
    assert {(g["lambda"], g["bm25_weight"]) for g in result["grid"] if g["Top-1"] == 100.0} == \
        {(lam, mu) for lam in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5) for mu in (0.3, 0.4, 0.5)}
    flat = Candidates(np.array([2.0, 1.0]), np.zeros(2), np.array([True, False]), bm25_z=np.zeros(2))
    assert tune_lambda([flat], k=1, bm25_grid=(0.0, 0.5))["bm25_weight"] == 0.0
    with pytest.raises(ValueError, match="bm25_z"):
        combined(Candidates(np.array([2.0, 1.0]), np.zeros(2)), 0.0, 0.5)


def test_lambda_tuning_picks_the_planted_best():
    """Question A needs lambda > 0.45 to lift its answer to the top, question B lambda < 0.55 to keep
    it there: on the grid 0, 0.1, ..., 2 only 0.5 gets both."""
    a = Candidates(np.array([2.0, 1.0]), np.array([-1 / 0.45, 1 / 0.45]), np.array([False, True]))
    b = Candidates(np.array([2.0, 1.0]), np.array([-1 / 0.55, 1 / 0.55]), np.array([True, False]))
    result = tune_lambda([a, b], k=1)
    assert result["lambda"] == 0.5 and result["best"] == 100.0
    assert [g["Top-1"] for g in result["grid"] if g["lambda"] in (0.4, 0.6)] == [50.0, 50.0]


def test_query_side_tuning_behind_the_prefilter_mines_the_pipelines_candidates(world, doc_model, tmp_path):
    """With --doc-index, train-query's candidates are the phrases the pre-filtered search scores: inside
    each question's top documents only, at most --max-answer-tokens long; and it still learns."""
    from odqa.common.io import read_json
    from odqa.retriever.args import QueryTrainArgs
    from odqa.retriever.query_train import train_query
    root = world["root"]
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    chosen, _ = docs.search(world["questions"], 2)
    common = dict(model=str(root / "phrase"), index=str(root / "index"), corpus=str(world["corpus"]),
                  questions=str(root / "questions.jsonl"), label="document", top_k=20, epochs=4, batch_size=5,
                  lr=2e-3, max_answer_tokens=3)
    result = train_query(from_flat(QueryTrainArgs, dict(**common, out_dir=str(tmp_path / "q"), doc_index=str(doc_model["index"]),
                                        doc_model=str(doc_model["dir"]), top_docs=2)))
    searcher = searcher_of(root / "index", root / "phrase", world["corpus"])
    meta, table = searcher.artifacts.index.meta, docs.table
    found = read_json(tmp_path / "q" / "candidates" / "epoch-1.json")
    assert found
    for c in found:
        rows = meta["passage_row"][c["start"]]
        assert set(table.doc_of_passage[rows].tolist()) <= set(chosen[c["question"]].tolist())
        assert (meta["passage_row"][c["end"]] == rows).all()
        span = meta["token"][c["end"]] - meta["token"][c["start"]]
        assert span.min() >= 0 and span.max() < 3
    losses = [h["loss"] for h in result["history"]]
    assert losses[-1] < losses[0]
    # Without the pre-filter the same settings mine from every document.
    train_query(from_flat(QueryTrainArgs, dict(**{**common, "epochs": 1}, out_dir=str(tmp_path / "plain"))))
    plain = read_json(tmp_path / "plain" / "candidates" / "epoch-1.json")
    assert any(not set(table.doc_of_passage[meta["passage_row"][c["start"]]].tolist())
               <= set(chosen[c["question"]].tolist()) for c in plain)
    with pytest.raises(InputError, match="--doc-model"):
        train_query(from_flat(QueryTrainArgs, dict(**common, out_dir=str(tmp_path / "x"), doc_index=str(doc_model["index"]))))


def test_cli_train_doc_index_tune_and_prefiltered_retrieve(world, tmp_path, capsys):
    from odqa.common.io import read_json
    from odqa.common.retrieval_file import read_results
    from odqa.system.cli import main
    root, corpus = world["root"], str(world["corpus"])
    sup = root / "sup"
    assert main(["train-doc", "--train-file", str(sup / "train.jsonl"), "--validation-file", str(sup / "validation.jsonl"),
                 "--corpus", corpus, "--out", str(tmp_path / "doc"), "--encoder", str(world["bert"]),
                 "--batch-size", "5", "--max-doc-tokens", "64"]) == 0
    assert "epoch 1: validation document Top-1" in capsys.readouterr().out
    # round 2: hard negatives mined with the round-1 model
    assert main(["train-doc", "--train-file", str(sup / "train.jsonl"), "--validation-file", str(sup / "validation.jsonl"),
                 "--corpus", corpus, "--out", str(tmp_path / "doc2"), "--encoder", str(tmp_path / "doc" / "best"),
                 "--negatives", "model", "--batch-size", "5"]) == 0
    assert "(10 with model negatives)" in capsys.readouterr().out
    assert main(["build-doc-index", "--model", str(tmp_path / "doc2" / "best"), "--out", str(tmp_path / "di"),
                 "--corpus", corpus]) == 0
    assert "Flat index of 10 documents" in capsys.readouterr().out
    common = ["--index", str(root / "index"), "--model", str(root / "phrase"), "--doc-index", str(tmp_path / "di"),
              "--doc-model", str(tmp_path / "doc2" / "best"), "--top-docs", "3", "--corpus", corpus]
    assert main(["tune-lambda", *common, "--questions", str(sup / "validation.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "| Top-20: lambda \\ BM25 weight | 0 | 0.1 |" in out and "\n| 2.0 | " in out and "best lambda" in out
    tuned = read_json(tmp_path / "di" / "lambda.json")
    assert len(tuned["grid"]) == 21 * 6 and {"lambda", "bm25_weight"} <= tuned.keys()
    assert main(["retrieve", "--retriever", "phrase", *common, "--questions", str(root / "questions.jsonl"),
                 "--k", "4", "--out", str(tmp_path / "run.json")]) == 0
    entries = read_results(tmp_path / "run.json")
    assert len(entries) == len(NAMES) and all(len(e["ctxs"]) == 4 for e in entries)
    assert all(e["prediction"] == e["ctxs"][0]["phrase"]["text"] for e in entries)
    assert main(["retrieve", "--retriever", "phrase", "--index", str(root / "index"), "--model", str(root / "phrase"),
                 "--doc-index", str(tmp_path / "di"), "--questions", str(root / "questions.jsonl"), "--out",
                 str(tmp_path / "x.json"), "--corpus", corpus]) == 2
    assert "--doc-model" in capsys.readouterr().err


def test_title_path_prefixes_sections_and_never_yields_candidates(world):
    from odqa.common.corpus import PassageStore
    from odqa.retriever.phrase_data import encode_passages, passage_title
    tokenizer = load_tokenizer(world["bert"])
    p = next(p for p in PassageStore(world["corpus"]) if p["section"] == ["Early life"])
    assert passage_title(p, True) == f"{p['title']}, Early life" and passage_title(p, False) == p["title"]
    enc = encode_passages(tokenizer, [passage_title(p, True)], [p["text"]], 64)
    tokens = tokenizer.convert_ids_to_tokens(enc.batch["input_ids"][0])
    title_part = tokens[1:tokens.index("[SEP]")]
    assert "early" in title_part and "life" in title_part
    assert not enc.candidate[0, 1:tokens.index("[SEP]") + 1].any()
    assert enc.candidate[0].sum() == len(tokenizer.tokenize(p["text"]))


def test_filter_labels_title_answers_in_the_title_path_the_model_read(world, tmp_path):
    """With --title-path and --title-phrases the dump's title tokens index "title, section": an answer
    that is a section's name is labelled there, and only there. A dump whose model read the title
    alone has no such tokens to label."""
    from odqa.common.corpus import PassageStore
    from odqa.retriever.phrase_dump import read_dump
    from odqa.retriever.phrase_filter import answer_labels
    tokenizer = load_tokenizer(world["bert"])
    passage = next(p for p in PassageStore(world["corpus"]) if p["section"] == ["Career"])
    example = {"passage_id": passage["id"], "title": passage["title"], "text": passage["text"],
               "answers": ["Career"], "answer_char_spans": []}
    counts = {}
    for title_path in (False, True):
        model = tmp_path / f"m{title_path}"
        DensePhraseModel(PhraseModelConfig(encoder=str(world["bert"]), max_passage_tokens=64, title_phrases=True,
                                           title_path=title_path)).save_pretrained(model, tokenizer)
        dump_phrases(model, world["corpus"], tmp_path / f"d{title_path}", chunk_passages=8)
        arrays, summary = read_dump(tmp_path / f"d{title_path}", world["corpus"])
        assert summary["title_path"] is title_path
        ids, labels, spans = answer_labels(arrays, [example, example], world["corpus"], summary["title_path"])
        assert len(spans) == 2    # one list of occurrences an example (the calibration's recall reads them)
        counts[title_path] = int(labels.sum()) // 2
        if title_path:
            (s, e), = spans[0]
            assert arrays["in_title"][s] and arrays["in_title"][e]
            segment = f"{passage['title']}, Career"
            assert segment[arrays["char_start"][s]:arrays["char_end"][e]] == "Career"
    assert counts == {False: 0, True: 2}


def test_in_doc_negatives_widen_the_single_passage_softmax(world):
    import torch

    from odqa.retriever.phrase_data import collate
    from odqa.retriever.phrase_train import PhraseLoss, PhraseTrainArgs, load_examples, with_passage_context
    root = world["root"]
    args = from_flat(PhraseTrainArgs, dict(train_file="", validation_file="", out_dir="", encoder="", in_doc_negatives="doc",
                           in_doc_count=2, corpus=str(world["corpus"]), pre_batch=0))
    examples = load_examples(str(root / "sup" / "train.jsonl"))[:4]
    with_passage_context(examples, args, world["corpus"])
    for ex in examples:  # the two other sections of the question's own document
        assert len(ex["negative_passages"]) == 2
        assert {n["doc_id"] for n in ex["negative_passages"]} == {ex["title"]} and ex["text"] not in \
            [n["text"] for n in ex["negative_passages"]]
    tokenizer = load_tokenizer(world["bert"])
    batch = collate(tokenizer, examples, 64, 16, 20, title_path=True)
    assert batch["negative_owner"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    model = DensePhraseModel.from_pretrained(root / "phrase")
    with torch.no_grad():
        _, with_neg = PhraseLoss(args)(model, batch, 0)
        plain = {k: v for k, v in batch.items() if not k.startswith("negative")}
        _, without = PhraseLoss(args)(model, plain, 0)
    # more tokens in the denominator, the same gold mass: strictly larger single-passage NLL
    assert with_neg["start_single"] > without["start_single"] and with_neg["end_single"] > without["end_single"]
    assert with_neg["start_neg"] == pytest.approx(without["start_neg"])


def test_cli_train_phrase_with_title_path_and_in_section_negatives(world, tmp_path, capsys):
    import json

    from odqa.system.cli import main
    sup = world["root"] / "sup"
    assert main(["train-phrase", "--train-file", str(sup / "train.jsonl"), "--validation-file", str(sup / "validation.jsonl"),
                 "--corpus", str(world["corpus"]), "--encoder", str(world["bert"]), "--out", str(tmp_path / "m"),
                 "--epochs", "1", "--batch-size", "5", "--title-path", "--in-doc-negatives", "section",
                 "--max-passage-tokens", "64"]) == 0
    assert "validation EM by epoch" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "best" / "phrase_config.json").read_text())["title_path"] is True


def test_a_damaged_document_encoder_is_named_not_taken_for_another(world, doc_model, tmp_path):
    import shutil

    from odqa.retriever.doc_index import DocRetriever
    damaged = tmp_path / "doc"
    shutil.copytree(doc_model["dir"], damaged)
    weights = damaged / "doc_lm" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"damaged document encoder: .*doc_lm/model.safetensors: its sha256 differs"):
        DocRetriever(doc_model["index"], damaged, world["corpus"])


def test_a_search_loads_the_question_side_alone_and_a_trainer_the_whole_model(world, doc_model, tmp_path):
    docs = DocRetriever(doc_model["index"], doc_model["dir"], world["corpus"])
    assert docs.model.doc_lm is None and docs.model.question_lm is not None
    searcher = searcher_of(world["root"] / "index", world["root"] / "phrase", world["corpus"], doc_index=docs)
    assert searcher.artifacts.model.phrase_lm is None
    with pytest.raises(ValueError, match="questions only"):
        searcher.artifacts.model.save_pretrained(tmp_path / "half")
    with pytest.raises(ValueError, match="questions only"):
        docs.model.save_pretrained(tmp_path / "half-doc")
    assert not (tmp_path / "half").exists() and not (tmp_path / "half-doc").exists()
    trained = Searcher.open(world["root"] / "index", world["root"] / "phrase", world["corpus"], trained=True)
    assert trained.artifacts.model.phrase_lm is not None
    assert trained.artifacts.model.q_start_lm.dtype == torch.float32
