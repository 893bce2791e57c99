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
