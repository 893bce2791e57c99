import json

import pytest
from tiny_data import TINY_DOCS, write_jsonl

from odqa.common.corpus import PassageStore, build_corpus
from odqa.common.io import InputError
from odqa.common.questions import load_questions
from odqa.common.retrieval_eval import answerable_flags, evaluate_results, format_table
from odqa.common.retrieval_file import read_results, write_results
from odqa.retriever.bm25 import BM25Index, BM25Params
from odqa.retriever.retrieve import retrieve


def test_bm25_ranks_the_passage_with_the_answer_first(tiny_corpus, tiny_questions):
    index = BM25Index.open(tiny_corpus)
    store = PassageStore(tiny_corpus)
    entries = retrieve(index, store, load_questions(tiny_questions), k=3)
    by_id = {e["id"]: e for e in entries}
    assert by_id["q0"]["ctxs"][0]["title"] == "Wilhelm Röntgen" and by_id["q0"]["ctxs"][0]["has_answer"]
    assert by_id["q1"]["ctxs"][0]["title"] == "The Beatles" and by_id["q1"]["ctxs"][0]["has_answer"]
    assert by_id["q2"]["ctxs"][0]["id"] == "paris#0"
    assert not any(c["has_answer"] for c in by_id["q4"]["ctxs"])
    scores = [c["score"] for c in by_id["q0"]["ctxs"]]
    assert scores == sorted(scores, reverse=True)


def test_index_is_saved_reused_and_rebuilt_when_stale(tiny_corpus, tiny_docs, tmp_path):
    BM25Index.open(tiny_corpus)
    manifest = tiny_corpus / "bm25" / "manifest.json"
    mtime = manifest.stat().st_mtime_ns
    BM25Index.open(tiny_corpus)
    assert manifest.stat().st_mtime_ns == mtime                           # reused
    BM25Index.open(tiny_corpus, BM25Params(k1=0.9))
    assert json.loads(manifest.read_text())["key"]["params"]["k1"] == 0.9        # other parameters: rebuilt
    build_corpus([write_jsonl(tmp_path / "more.jsonl", TINY_DOCS[:2])], tiny_corpus)
    with pytest.raises(InputError, match="another version of the corpus"):
        BM25Index.load(tiny_corpus)
    assert BM25Index.open(tiny_corpus).num_passages == 4                  # rebuilt for the new corpus


@pytest.mark.parametrize("method", ["lucene", "bm25+"])
def test_scores_of_some_rows_equal_every_passages_scores_to_the_bit(tiny_corpus, method):
    """The rerank's BM25 term reads only its candidates' scores; they are the whole vector's, for
    repeated terms, unknown terms, repeated and absent rows, and a question of stop words only (all
    zero, where bm25s's get_scores fails on an empty token list). BM25+ also scores absent terms."""
    import numpy as np
    index = BM25Index.open(tiny_corpus, BM25Params(method=method))
    rows = np.array([3, 0, 0, 2, 1, 3])
    for question in ("who discovered x-rays", "beatles beatles liverpool band", "zzyzx", "the of a", "to be or not to be"):
        every = index.scores(question)
        assert every.shape == (index.num_passages,) and every.dtype == np.float32
        got = index.scores_of(question, rows)
        assert got.dtype == every.dtype and got.tobytes() == every[rows].tobytes(), question
        assert index.scores_of(question, []).shape == (0,)
    assert not index.scores("the of a").any() and index.scores("beatles").any()


def test_the_index_built_a_chunk_at_a_time_from_term_ids_scores_as_bm25s_over_tokens():
    """`from_texts` keeps only int32 term ids, a chunk of texts at a time; bm25s indexing the token
    strings of all the texts at once (what the build did before) gives the same scores to the bit."""
    import bm25s
    import numpy as np

    from odqa.retriever.bm25 import TermIds
    texts = [f"{d['title']} {' '.join(p for sec in d['sections'] for p in sec['paragraphs'])}" for d in TINY_DOCS] \
        + ["the of a", "Röntgen röntgen x-rays rays", "The Beatles were an English rock band from Liverpool."]
    index = BM25Index.from_texts(iter(texts), show_progress=False, chunk=2)
    whole = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    whole.index(index.tokenize(texts), show_progress=False)
    assert index.num_passages == len(texts)
    for question in ("who discovered x-rays", "beatles band liverpool", "röntgen", "the of a", "unknownword"):
        tokens = index.tokenize([question])[0]
        want = whole.get_scores(tokens) if tokens else np.zeros(len(texts), np.float32)
        assert index.scores(question).tobytes() == want.tobytes(), question
    ids = TermIds(np.array([4, 5, 6, 7], np.int32), np.array([0, 3, 3, 4]))
    assert list(ids) == [[4, 5, 6], [], [7]] and len(ids) == 3 and ids[2] == [7]
    with pytest.raises(InputError, match="no words"):
        BM25Index.from_texts(["the of a", "to be"], show_progress=False)


def test_retrieval_file_round_trip_and_metrics(tiny_corpus, tiny_questions, tmp_path):
    index = BM25Index.open(tiny_corpus)
    entries = retrieve(index, PassageStore(tiny_corpus), load_questions(tiny_questions), k=100)
    assert all(len(e["ctxs"]) == 6 for e in entries)                      # k is capped by the corpus
    path = tmp_path / "run.json"
    write_results(path, entries)
    assert read_results(path) == entries
    assert path.read_text() == json.dumps(entries, ensure_ascii=False) + "\n"   # one JSON array, as json.dump writes it
    write_results(path, [])
    with pytest.raises(InputError, match="holds no questions"):    # not a table of 0.0s
        read_results(path)
    answerable = answerable_flags(entries, tiny_corpus)
    assert answerable == [True, True, True, True, False]
    metrics = evaluate_results(entries, answerable, ks=(1, 5))
    assert metrics["all"]["questions"] == 5 and metrics["answerable"]["questions"] == 4
    assert metrics["answerable"]["Top-5"] == 100.0
    assert metrics["all"]["Top-5"] == 80.0


def test_the_extractive_answer_is_scored_over_all_and_over_a_right_first_passage():
    def entry(prediction, first, second):
        return {"question": "q", "answers": ["rome"], "prediction": prediction,
                "ctxs": [{"has_answer": first}, {"has_answer": second}]}
    entries = [entry("rome", True, False), entry("paris", True, True), entry("milan", False, True),
               entry("Rome", False, False)]            # right without an answer-bearing passage: EM, not a read
    metrics = evaluate_results(entries, [True, True, True, False], ks=(1, 2))
    em, read = "extractive EM", "extractive EM (Top-1 hit)"
    assert metrics["all"][em] == 50.0 and metrics["all"][read] == 50.0    # 1 of the 2 first hits
    assert metrics["answerable"][em] == pytest.approx(100 / 3) and metrics["answerable"][read] == 50.0
    no_prediction = evaluate_results([{k: v for k, v in entries[0].items() if k != "prediction"}], ks=(1,))["all"]
    assert not [column for column in no_prediction if "EM" in column]
    no_first_hit = evaluate_results([entry("rome", False, True)], ks=(1,))
    assert no_first_hit["all"][em] == 100.0 and read not in no_first_hit["all"]
    assert format_table({"run": metrics, "no hit": no_first_hit}).splitlines()[-1].endswith("| 100.0 | - |")


def test_each_extractive_em_is_named_for_the_answer_and_the_gold_it_scores():
    """The memory-assisted "prediction" and the phrase's own "prediction_without_memory" are scored apart
    (once, "EM" scored the first while the report's "extractive EM" scored the second); where entries
    carry NQ-open's "answers_raw", each EM is scored against them too."""
    def entry(own, helped, answers, raw):
        return {"question": "q", "answers": answers, "answers_raw": raw, "prediction": helped,
                "prediction_without_memory": own, "ctxs": [{"has_answer": True}]}
    entries = [entry("1950-51", "1950-51", ["1950 - 51"], ["1950-51"]),   # DPR's tokens: "1950 51" against "195051"
               entry("paris", "rome", ["rome"], ["Rome"])]
    m = evaluate_results(entries, ks=(1,))["all"]
    assert m["extractive EM"] == 0.0 and m["extractive + memory EM"] == 50.0
    assert m["extractive EM (NQ-open answers)"] == 50.0 and m["extractive + memory EM (NQ-open answers)"] == 100.0


def test_no_figure_is_given_past_the_files_depth():
    """A 10-deep file once showed Top-20 and Top-100 as its Top-10, and P@20 of a 5-deep file was divided by
    20: past the shallowest question's ctxs there is no figure (None; "-" in the table)."""
    ten = [{"question": "q", "answers": ["a"], "ctxs": [{"has_answer": i == 7} for i in range(10)]}]
    m = evaluate_results(ten, ks=(1, 5, 10, 20, 100))["all"]
    assert m["Top-10"] == 100.0 and m["Top-5"] == 0.0 and m["depth"] == 10
    assert m["Top-20"] is m["Top-100"] is m["MRR@20"] is m["P@20"] is None
    row = format_table({"ten": {"all": m}}).splitlines()[-1]
    assert row == "| ten | all | 1 | 0.0 | 0.0 | 100.0 | - | - | - | - |"
    deep = [{"question": "q", "answers": ["a"], "ctxs": [{"has_answer": i < 5} for i in range(20)]}]
    assert evaluate_results(deep, ks=(20,))["all"]["P@20"] == 25.0


def test_read_results_rejects_a_file_of_another_shape(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"question": "q", "ctxs": [{"id": "1"}]}]))
    with pytest.raises(InputError, match="ctx 0 has no \"has_answer\""):
        read_results(path)
    path.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        read_results(path)


def test_single_vector_dense_retriever(tiny_corpus, tiny_questions, tmp_path):
    """The single-vector comparator on a tiny BERT made here: exact inner product equals brute force."""
    import numpy as np
    from tiny_data import TINY_DOCS, TINY_QUESTIONS
    from tiny_models import make_tiny_bert

    from odqa.retriever.dense import DenseIndex
    texts = [p for d in TINY_DOCS for s in d["sections"] for p in s["paragraphs"]] + [q["question"] for q in TINY_QUESTIONS]
    encoder = str(make_tiny_bert(tmp_path / "bert", texts + [d["title"] for d in TINY_DOCS]))
    index = DenseIndex.open(tiny_corpus, encoder)
    store = PassageStore(tiny_corpus)
    passages = list(store)
    p_vecs = index.encoder.encode([f"{p['title']} {p['text']}" for p in passages])
    assert np.allclose(np.linalg.norm(p_vecs, axis=1), 1.0, atol=1e-5)
    q_vecs = index.encoder.encode(["who won the first nobel prize in physics"])
    rows, scores = index.search_passages(["who won the first nobel prize in physics"], k=3)
    expected = np.argsort(-(p_vecs @ q_vecs[0]))[:3]
    assert list(rows[0]) == list(expected)
    assert DenseIndex.index_dir(tiny_corpus, encoder).exists()                 # saved, and reused next time
    assert DenseIndex.open(tiny_corpus, encoder).index.ntotal == len(passages)


def test_retrieve_writes_a_trec_run_of_the_same_ranking(tiny_corpus, tiny_questions, tmp_path, capsys):
    """`--format trec`: the DPR file's ranking as `QID Q0 DOCID RANK SCORE TAG` lines, which trec_eval reads."""
    import json

    from odqa.system.cli import main
    base = ["-q", "retrieve", "--retriever", "bm25", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus),
            "--k", "3"]
    assert main([*base, "--out", str(tmp_path / "r.json")]) == 0
    assert main([*base, "--format", "trec", "--out", str(tmp_path / "r.trec")]) == 0
    entries = json.loads((tmp_path / "r.json").read_text())
    lines = [line.split() for line in (tmp_path / "r.trec").read_text().splitlines()]
    assert lines == [[e["id"], "Q0", c["id"], str(rank), f"{c['score']:.6f}", "odqa-bm25"]
                     for e in entries for rank, c in enumerate(e["ctxs"], 1)]
    assert len(lines) == 3 * len(entries)
    from urllib.parse import unquote

    from odqa.common.retrieval_file import trec_id
    for name in ("William Shakespeare#1", "100% Pure#0", "a\tb"):   # a title's white space, and "%"
        assert " " not in trec_id(name) and "\t" not in trec_id(name) and unquote(trec_id(name)) == name


def test_the_pyserini_preset_is_its_k1_and_b_and_the_run_says_which_it_used(tmp_path, tiny_corpus, tiny_questions, capsys):
    """pyserini's published BM25 figures on DPR's Wikipedia use k1 0.9, b 0.4: --bm25-preset pyserini gives
    them, the same index as those values given by hand, and the run's line names them."""
    from odqa.common.io import InputError
    from odqa.retriever.args import BM25Params
    from odqa.retriever.bm25 import BM25Index
    from odqa.system.cli import main
    assert (BM25Params(bm25_preset="pyserini").k1, BM25Params(bm25_preset="pyserini").b) == (0.9, 0.4)
    assert BM25Index.key("f", BM25Params(bm25_preset="pyserini")) == BM25Index.key("f", BM25Params(k1=0.9, b=0.4))
    with pytest.raises(InputError, match="--bm25-preset pyserini sets --k1 0.9 and --b 0.4: give the preset or"):
        BM25Params(bm25_preset="pyserini", k1=1.2)
    runs = {}
    for name, flags in (("preset", ["--bm25-preset", "pyserini"]), ("hand", ["--k1", "0.9", "--b", "0.4"]),
                        ("default", [])):
        assert main(["-q", "retrieve", "--questions", str(tiny_questions), "--corpus", str(tiny_corpus), "--k", "3",
                     "--out", str(tmp_path / f"{name}.json"), *flags]) == 0
        runs[name] = [[c["id"] for c in e["ctxs"]] for e in json.loads((tmp_path / f"{name}.json").read_text())]
        runs[name + " line"] = capsys.readouterr().out.strip()
    assert runs["preset"] == runs["hand"]
    assert runs["preset line"].endswith("(BM25 k1 0.9, b 0.4: pyserini's)")
    assert runs["default line"].endswith("(BM25 k1 1.5, b 0.75)")
