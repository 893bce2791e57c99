"""The system on a tiny corpus with tiny untrained models: the pipeline returns both kinds of answer;
the server answers, refuses bad input with 4xx, and survives a reader error."""
import pytest
from fastapi.testclient import TestClient

from common.corpus import PassageStore, build_corpus
from retriever.doc_encoder import load_doc_tokenizer
from retriever.phrase_dump import dump_phrases
from retriever.phrase_index import build_index
from retriever.phrase_model import DensePhraseModel, PhraseModelConfig
from retriever.searcher import Searcher
from system.pipeline import Pipeline
from system.serve import create_app
from tiny_data import TINY_DOCS, TINY_QUESTIONS, write_jsonl
from tiny_models import make_tiny_bert, make_tiny_t5


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("system")
    corpus = root / "corpus"
    build_corpus([write_jsonl(root / "docs.jsonl", TINY_DOCS)], corpus)
    texts = [p["title"] + " " + p["text"] for p in PassageStore(corpus)] + [q["question"] for q in TINY_QUESTIONS]
    bert = make_tiny_bert(root / "bert", texts)
    DensePhraseModel(PhraseModelConfig(str(bert), max_passage_tokens=64)).save_pretrained(root / "phrase",
                                                                                       load_doc_tokenizer(bert))
    dump_phrases(root / "phrase", corpus, root / "dump")
    build_index(root / "dump", root / "index", corpus)
    make_tiny_t5(root / "t5", texts * 4, vocab_size=300)
    searcher = Searcher(root / "index", root / "phrase", corpus)
    return {"root": root, "corpus": corpus, "pipeline": Pipeline.load(searcher, root / "t5")}


def test_pipeline_returns_both_answers_and_the_passages(system):
    questions = [q["question"] for q in TINY_QUESTIONS[:3]]
    out = system["pipeline"].answer(questions, k=2)
    assert [a["question"] for a in out] == questions
    for a in out:
        passage = next(p for p in a["passages"] if p["id"] == a["extractive"]["passage_id"])
        ex = a["extractive"]
        assert passage["text"][ex["char_start"]:ex["char_end"]] == ex["text"] != ""
        assert isinstance(a["generated"], str)
        assert len(a["passages"]) == 2 and a["passages"][0]["phrase"]["text"]
        assert a["timings"]["retrieve_ms"] > 0 and a["timings"]["read_ms"] > 0


def test_server_answers_and_validates(system):
    with TestClient(create_app(system["pipeline"], max_batch=4, max_wait_ms=5)) as client:
        assert client.get("/health").json()["status"] == "ok"
        r = client.post("/answer", json={"question": "  who won the first nobel prize in physics ", "k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["question"] == "who won the first nobel prize in physics"
        assert set(body) == {"question", "extractive", "generated", "passages", "timings"}
        assert len(body["passages"]) == 3 and body["extractive"]["text"]
        for bad in ({"question": "", "k": 3}, {"question": "   "}, {"question": "x" * 501}, {"question": "q", "k": 0},
                    {"question": "q", "k": 101}, {"question": 7}, {"question": "q", "k": "5"}, {"k": 3}):
            r = client.post("/answer", json=bad)
            assert r.status_code == 422, (bad, r.status_code)
            assert r.json()["detail"]
        assert client.post("/answer", content=b"not json", headers={"content-type": "application/json"}).status_code == 422
        assert "/answer" in client.get("/openapi.json").json()["paths"]


def test_a_reader_error_is_a_500_and_the_server_keeps_serving(system, monkeypatch):
    pipeline = system["pipeline"]
    with TestClient(create_app(pipeline)) as client:
        def broken(*a, **k):
            raise RuntimeError("reader exploded")
        monkeypatch.setattr(pipeline, "model", type("Broken", (), {"generate": broken, "training": False,
                                                                   "generation_config": pipeline.model.generation_config,
                                                                   "eval": lambda self: self, "train": lambda self, m: self})())
        r = client.post("/answer", json={"question": "how tall is mount everest"})
        assert r.status_code == 500 and "reader exploded" in r.json()["detail"]
        monkeypatch.undo()
        r = client.post("/answer", json={"question": "how tall is mount everest", "k": 2})
        assert r.status_code == 200 and len(r.json()["passages"]) == 2


def test_concurrent_requests_are_batched(system):
    import concurrent.futures
    with TestClient(create_app(system["pipeline"], max_batch=8, max_wait_ms=200)) as client:
        questions = [q["question"] for q in TINY_QUESTIONS] * 2
        with concurrent.futures.ThreadPoolExecutor(len(questions)) as pool:
            rs = list(pool.map(lambda q: client.post("/answer", json={"question": q, "k": 2}), questions))
        assert all(r.status_code == 200 for r in rs)
        assert [r.json()["question"] for r in rs] == questions
        assert max(r.json()["timings"]["questions_in_batch"] for r in rs) > 1
        assert client.get("/health").json()["batches"] < len(questions)


def test_cli_ask_prints_both_answers_and_marks_the_phrase(system, capsys):
    from system.cli import main
    root = system["root"]
    assert main(["ask", "how tall is mount everest", "--k", "2", "--index", str(root / "index"), "--model",
                 str(root / "phrase"), "--reader", str(root / "t5"), "--corpus", str(system["corpus"])]) == 0
    out = capsys.readouterr().out
    assert "extractive: " in out and "generated: " in out and "[[" in out and " 2. " in out
    assert main(["ask", "  ", "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader",
                 str(root / "t5"), "--corpus", str(system["corpus"])]) == 2
    assert "empty question" in capsys.readouterr().err


def test_odqa_run_report_equals_the_per_question_file_and_resumes(system, tmp_path, capsys):
    import json
    from system.cli import main
    root = system["root"]
    qfile = write_jsonl(tmp_path / "tiny-q.jsonl", TINY_QUESTIONS)
    argv = ["run", "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader", str(root / "t5"),
            "--out-dir", str(tmp_path / "run"), "--questions", str(qfile), "--k", "1", "3", "--corpus",
            str(system["corpus"]), "--dense-encoder", str(root / "bert")]
    assert main(argv) == 0
    assert "| tiny-q | 3 |" in capsys.readouterr().out
    out = tmp_path / "run"
    for name in ("report.md", "report.json", "questions.jsonl", "em_by_k.png", "topk.png", "retrieval-tiny-q.json",
                 "fid-tiny-q-k3.jsonl", "pred-tiny-q-k1.jsonl", "bm25-tiny-q.json", "dense-tiny-q.json"):
        assert (out / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    rows = json.loads((out / "report.json").read_text())["rows"]
    assert [(r["dataset"], r["k"]) for r in rows] == [("tiny-q", 1), ("tiny-q", 3)]
    for row in rows:
        k = str(row["k"])
        ext = [r["extractive_em"] for r in records]
        gen = [r["k"][k]["generated_em"] for r in records]
        assert row["questions"] == len(records) == len(TINY_QUESTIONS)
        assert row["extractive EM"] == pytest.approx(100 * sum(ext) / len(records))
        assert row["generated EM"] == pytest.approx(100 * sum(gen) / len(records))
        assert row["Top-k"] == pytest.approx(100 * sum(r["k"][k]["hit"] for r in records) / len(records))
        assert row["only extractive right"] == sum(e and not g for e, g in zip(ext, gen))
        assert row["only generated right"] == sum(g and not e for e, g in zip(ext, gen))
    # every extractive answer is the top phrase of the retrieval file, every hit its has_answer
    retrieval = json.loads((out / "retrieval-tiny-q.json").read_text())
    assert [r["extractive"] for r in records] == [e["prediction"] for e in retrieval]
    assert [r["k"]["1"]["hit"] for r in records] == [e["ctxs"][0]["has_answer"] for e in retrieval]
    # a rerun reuses every file; changing k makes only the new k's files
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.suffix in (".json", ".jsonl")
              and not p.name.startswith(("report", "questions", "run_args"))}
    assert main(argv) == 0
    k_at = argv.index("--k")
    assert main(argv[:k_at + 1] + ["1", "2"] + argv[k_at + 3:]) == 0
    for name, stamp in stamps.items():
        assert (out / name).stat().st_mtime_ns == stamp, name
    assert (out / "pred-tiny-q-k2.jsonl").exists()
