"""The system on a tiny corpus with tiny untrained models: the pipeline returns both kinds of answer;
the server answers, refuses bad input with 4xx, survives a reader error, sheds load with 429 and 503,
says when it is loading, exports Prometheus metrics and finishes requests in flight on shutdown."""
import json
import os

import pytest
from fastapi.testclient import TestClient
from tiny_data import TINY_QUESTIONS, write_jsonl
from tiny_models import make_tiny_system

import odqa
from odqa.common.settings import from_flat
from odqa.system.args import PipelineParts
from odqa.system.pipeline import Pipeline, assemble
from odqa.system.serve import create_app


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    world = make_tiny_system(tmp_path_factory.mktemp("system"))
    parts = PipelineParts(index=str(world["index"]), model=str(world["phrase"]), corpus=str(world["corpus"]),
                          reader=str(world["t5"]))
    return {"root": world["root"], "corpus": world["corpus"], "pipeline": assemble(parts, record=None).loaded()}


def test_pipeline_returns_both_answers_and_the_passages(system):
    questions = [q["question"] for q in TINY_QUESTIONS[:3]]
    out = system["pipeline"].answer(questions, k=2)
    deep = system["pipeline"].answer(questions, k=25)   # every passage that votes is shown
    assert [a["question"] for a in out] == questions
    for a, d in zip(out, deep):
        assert a["extractive"] == d["extractive"] and 0 < a["extractive"]["support"] <= 1   # the vote ignores k
        passage = next(p for p in d["passages"] if p["id"] == a["extractive"]["passage_id"])
        ex = a["extractive"]
        assert passage["text"][ex["char_start"]:ex["char_end"]] == ex["text"] != ""
        assert isinstance(a["generated"], str)
        assert len(a["passages"]) == 2 and a["passages"][0]["phrase"]["text"]
        assert a["timings"]["retrieve_ms"] > 0 and a["timings"]["read_ms"] > 0


def test_phrase_decoding_answers_with_a_passage_phrase_or_the_spans_answer(system):
    """`--decoding phrases` through the pipeline, on its T5 reader: the generated answer is the spans
    answer or one of the k passages' best phrases."""
    from odqa.reader.args import ReaderSettings
    base = system["pipeline"]
    questions = [q["question"] for q in TINY_QUESTIONS[:4]]
    spans = base.answer(questions, k=3)
    fused = Pipeline(base.parts, base.search_config, ReaderSettings(decoding="phrases"), searcher=base.searcher,
                     reader=base.reader).answer(questions, k=3)
    for s, f in zip(spans, fused):
        assert f["generated"] == s["generated"] or f["generated"] in [p["phrase"]["text"] for p in f["passages"]]


def test_server_answers_and_validates(system):
    with TestClient(create_app(system["pipeline"], max_batch=4, max_wait_ms=5)) as client:
        assert client.get("/health").json()["status"] == "ready"
        r = client.post("/answer", json={"question": "  who won the first nobel prize in physics ", "k": 3})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["question"] == "who won the first nobel prize in physics"
        assert set(body) == {"question", "extractive", "generated", "passages", "timings"}
        assert len(body["passages"]) == 3 and body["extractive"]["text"]
        # an odqa.Answer, less its memory, as the schema at /docs says
        assert odqa.Answer.from_dict(body) == odqa.Answer.from_dict(system["pipeline"].answer([body["question"]], 3)[0])
        schema = client.get("/openapi.json").json()
        response = schema["paths"]["/answer"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert response["$ref"].endswith("/Answer") and "Passage" in schema["components"]["schemas"]
        for bad in ({"question": "", "k": 3}, {"question": "   "}, {"question": "x" * 501}, {"question": "q", "k": 0},
                    {"question": "q", "k": 101}, {"question": 7}, {"question": "q", "k": "5"}, {"k": 3}):
            r = client.post("/answer", json=bad)
            assert r.status_code == 422, (bad, r.status_code)
            assert r.json()["detail"]
        assert client.post("/answer", content=b"not json", headers={"content-type": "application/json"}).status_code == 422
        assert "/answer" in client.get("/openapi.json").json()["paths"]


def test_a_request_may_change_settings_within_the_servers_limits(system):
    from odqa.system.serve import SETTING_LIMITS
    with TestClient(create_app(system["pipeline"], max_batch=4, max_wait_ms=5)) as client:
        asked = {"question": "who won the first nobel prize in physics", "k": 3}
        first = client.post("/answer", json={**asked, "settings": {"answer_depth": 1, "decoding": "free"}})
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["extractive"]["text"] == body["passages"][0]["phrase"]["text"]    # no vote: the first phrase
        assert system["pipeline"].searcher.config.answer.answer_depth != 1                 # the server's own are unchanged
        for bad, said in (({"depth": 1}, "not request settings: depth"), ({"nprobe": 8}, "not request settings: nprobe"),
                          ({"answer_depth": 0}, "--answer-depth: must be at least 1"),
                          ({"answer_depth": SETTING_LIMITS["answer_depth"] + 1}, "over this server's limits"),
                          ({"decoding": "beam"}, "--decoding must be one of"), ({"num_beams": [2]}, "")):
            r = client.post("/answer", json={**asked, "settings": bad})
            assert r.status_code == 422 and said in r.text, (bad, r.text)


def test_a_reader_error_is_a_500_and_the_server_keeps_serving(system, monkeypatch):
    pipeline = system["pipeline"]
    with TestClient(create_app(pipeline)) as client:
        def broken(*a, **k):
            raise RuntimeError("reader exploded")
        model, tokenizer = pipeline.reader
        monkeypatch.setattr(pipeline, "_reader", (type("Broken", (), {
            "generate": broken, "get_encoder": lambda self: broken, "training": False,
            "generation_config": model.generation_config, "config": model.config, "eval": lambda self: self,
            "train": lambda self, m: self})(), tokenizer))
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
    from odqa.system.cli import main
    root = system["root"]
    assert main(["ask", "how tall is mount everest", "--k", "2", "--index", str(root / "index"), "--model",
                 str(root / "phrase"), "--reader", str(root / "t5"), "--corpus", str(system["corpus"])]) == 0
    out = capsys.readouterr().out
    assert "extractive: " in out and "generated: " in out and "[[" in out and " 2. " in out
    assert "% of the top passages' votes)" in out
    assert main(["ask", "how tall is mount everest", "--k", "2", "--decoding", "phrases", "--index", str(root / "index"),
                 "--model", str(root / "phrase"), "--reader", str(root / "t5"), "--corpus", str(system["corpus"])]) == 0
    assert "(FiD over 2 passages, chosen among their phrases)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:      # up front: the missing index is never opened
        main(["ask", "  ", "--index", str(root / "no-such-index"), "--model", str(root / "phrase"), "--reader",
              str(root / "t5"), "--corpus", str(system["corpus"])])
    assert refused.value.code == 2
    assert "argument question: must not be empty, not '  '" in capsys.readouterr().err


def test_the_odqa_script_ends_ask_at_once_with_its_whole_output_and_status(system, tmp_path):
    """The script ends `odqa ask` without the interpreter's teardown (`cli._exit_now`): output written to a
    file (block-buffered, so lost unless flushed), the exit status of success and of bad input, and a
    reader that closes the pipe early; `main` called in-process returns instead."""
    import subprocess
    import sys

    from odqa.system import cli
    root = system["root"]
    flags = ["--k", "2", "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader", str(root / "t5"),
             "--corpus", str(system["corpus"])]
    script = [sys.executable, "-m", "odqa.system.cli", "ask"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "out.txt", "w") as out:
        done = subprocess.run([*script, "how tall is mount everest", *flags], stdout=out, stderr=subprocess.PIPE,
                              text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "out.txt").read_text().splitlines()
    assert lines[0] == "question:   how tall is mount everest" and lines[-1].startswith("retrieve ")
    bad = subprocess.run([*script, "how tall is mount everest", *flags[:2], "--index", str(tmp_path / "none"),
                          *flags[4:]], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 2 and "odqa: error: " in bad.stderr and "Traceback" not in bad.stderr
    head = subprocess.run(f"{' '.join(map(str, script))} 'how tall is mount everest' {' '.join(flags)} | head -1",
                          shell=True, capture_output=True, text=True, env=env, timeout=300)
    assert head.stdout == "question:   how tall is mount everest\n" and "Traceback" not in head.stderr
    exits = []
    assert cli.main(["ask", "how tall is mount everest", *flags]) == 0   # in-process: returns
    monkey = pytest.MonkeyPatch()
    monkey.setattr(cli.os, "_exit", exits.append)
    try:
        cli.main(["ask", "how tall is mount everest", *flags], quick_exit=True)
        cli.main(["verify", str(root / "index")], quick_exit=True)   # a command that does not ask for it
    finally:
        monkey.undo()
    assert exits == [0]


def test_odqa_run_report_equals_the_per_question_file_and_resumes(system, tmp_path, capsys):
    import json

    from odqa.system.cli import main
    root = system["root"]
    qfile = write_jsonl(tmp_path / "tiny-q.jsonl", TINY_QUESTIONS)
    argv = ["run", "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader", str(root / "t5"),
            "--out", str(tmp_path / "run"), "--questions", str(qfile), "--k", "1", "3", "--corpus",
            str(system["corpus"]), "--dense-encoder", str(root / "bert")]
    assert main(argv) == 0
    assert "| tiny-q | 3 |" in capsys.readouterr().out
    out = tmp_path / "run"
    for name in ("report.md", "report.json", "questions.jsonl", "em_by_k.png", "topk.png", "retrieval-tiny-q.json",
                 "fid-tiny-q-k3.jsonl", "pred-tiny-q-k1.jsonl", "bm25-tiny-q.json", "dense-tiny-q.json"):
        assert (out / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (out / "questions.jsonl").read_text().splitlines()]
    from odqa.common.results import RunQuestion  # each line is one, typed, and back to the same JSON
    assert [RunQuestion.from_dict(r).to_dict() for r in records] == records
    assert set(RunQuestion.from_dict(records[0]).k) == {1, 3}
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
        # F1 as SQuAD's script gives it, a question's best over its answers, and never below its EM
        from odqa.common.metrics import f1_score
        assert row["generated F1"] == pytest.approx(
            100 * sum(f1_score(r["k"][k]["generated"], r["answers"]) for r in records) / len(records))
        assert row["extractive F1"] >= row["extractive EM"] and row["generated F1"] >= row["generated EM"]
    # every extractive answer is the retrieval file's prediction, every hit its has_answer
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
    # another extractive vote makes the retrieval anew (the answer is in it) and reads nothing again
    assert main([*argv, "--answer-depth", "1"]) == 0
    assert (out / "pred-tiny-q-k3.jsonl").stat().st_mtime_ns == stamps["pred-tiny-q-k3.jsonl"]
    assert (out / "retrieval-tiny-q.json").stat().st_mtime_ns != stamps["retrieval-tiny-q.json"]
    retrieval = json.loads((out / "retrieval-tiny-q.json").read_text())
    assert [e["prediction"] for e in retrieval] == [e["ctxs"][0]["phrase"]["text"] for e in retrieval]
    # so does a file made under the filter's older rules; the reader reads again only where it decodes
    # the passages' phrases
    key_file = out / "retrieval-tiny-q.json.key.json"
    key = json.loads(key_file.read_text())
    key_file.write_text(json.dumps({**key, "answer_filter": True}))   # as rules 1 wrote it
    stamp = (out / "retrieval-tiny-q.json").stat().st_mtime_ns
    assert main([*argv, "--answer-depth", "1"]) == 0
    assert (out / "retrieval-tiny-q.json").stat().st_mtime_ns != stamp
    assert json.loads(key_file.read_text()) == key
    assert (out / "pred-tiny-q-k3.jsonl").stat().st_mtime_ns == stamps["pred-tiny-q-k3.jsonl"]
    phrases = [*argv, "--decoding", "phrases"]
    assert main(phrases) == 0
    stamp = (out / "pred-tiny-q-k3.jsonl").stat().st_mtime_ns
    assert main([*phrases, "--answer-depth", "1"]) == 0
    assert (out / "pred-tiny-q-k3.jsonl").stat().st_mtime_ns == stamp
    assert main([*phrases, "--no-answer-filter"]) == 0
    assert (out / "pred-tiny-q-k3.jsonl").stat().st_mtime_ns != stamp


def test_odqa_run_reads_a_sets_first_n_questions_and_refuses_a_set_named_twice(system, tmp_path, capsys):
    import json

    from odqa.system.cli import main
    root = system["root"]
    qfile = write_jsonl(tmp_path / "tiny-q.jsonl", TINY_QUESTIONS)
    argv = ["run", "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader", str(root / "t5"),
            "--out", str(tmp_path / "run"), "--questions", f"{qfile}:2", "--k", "1", "--corpus",
            str(system["corpus"]), "--baselines", "none"]
    assert len(TINY_QUESTIONS) > 2 and main(argv) == 0
    rows = json.loads((tmp_path / "run" / "report.json").read_text())["rows"]
    assert [(r["dataset"], r["questions"]) for r in rows] == [("tiny-q", 2)]
    assert len(json.loads((tmp_path / "run" / "retrieval-tiny-q.json").read_text())) == 2
    capsys.readouterr()
    q_at = argv.index("--questions")
    assert main(argv[:q_at + 1] + [str(qfile)] + argv[q_at + 1:]) != 0
    assert "names a set twice" in capsys.readouterr().err


class SlowPipeline:
    """A pipeline whose batches take `seconds`; it records the questions it was asked."""

    def __init__(self, seconds: float):
        self.seconds, self.asked = seconds, []

    def answer(self, questions, k=10, **settings):
        import time
        time.sleep(self.seconds)
        self.asked += questions
        return [{"question": q, "extractive": None, "generated": "x", "passages": [],
                 "timings": {"retrieve_ms": 1.0, "read_ms": 2.0, "questions_in_batch": len(questions)}} for q in questions]


def test_overload_is_answered_429_with_retry_after_and_a_slow_request_503():
    import concurrent.futures
    slow = SlowPipeline(0.5)
    with TestClient(create_app(slow, max_batch=1, max_wait_ms=1, max_queue=2, timeout_s=30)) as client:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            rs = list(pool.map(lambda i: client.post("/answer", json={"question": f"q{i}"}), range(12)))
        codes = sorted(r.status_code for r in rs)
        assert set(codes) == {200, 429} and codes.count(200) >= 3, codes
        assert all(int(r.headers["retry-after"]) >= 1 for r in rs if r.status_code == 429)
    slow = SlowPipeline(1.0)
    with TestClient(create_app(slow, max_batch=1, max_wait_ms=1, timeout_s=0.3)) as client:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            rs = list(pool.map(lambda i: client.post("/answer", json={"question": f"t{i}"}), range(3)))
        assert [r.status_code for r in rs] == [503] * 3 and "not answered within" in rs[0].json()["detail"]
        import time
        time.sleep(1.2)
        assert len(slow.asked) == 1      # the two that timed out before their batch started were dropped
        slow.seconds = 0.01
        assert client.post("/answer", json={"question": "after"}).status_code == 200   # still answering
    slow = SlowPipeline(0.3)
    with TestClient(create_app(slow, max_batch=1, max_wait_ms=1, max_queue=100, max_queue_s=0.5)) as client:
        assert client.post("/answer", json={"question": "measure"}).status_code == 200   # 0.3 s a request
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            rs = list(pool.map(lambda i: client.post("/answer", json={"question": f"w{i}"}), range(8)))
        answered = [r for r in rs if r.status_code == 200]
        assert {r.status_code for r in rs} == {200, 429} and len(answered) <= 4
        assert max(r.json()["timings"]["total_ms"] for r in answered) < 2000   # nobody waited behind 7 others


def test_metrics_count_requests_by_status_and_time_the_stages():
    with TestClient(create_app(SlowPipeline(0.01), max_batch=4)) as client:
        assert client.post("/answer", json={"question": "q"}).status_code == 200
        assert client.post("/answer", json={"question": ""}).status_code == 422
        text = client.get("/metrics").text
    from prometheus_client.parser import text_string_to_metric_families
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"odqa_requests", "odqa_queue_depth", "odqa_batch_size", "odqa_stage_seconds", "odqa_ready"} <= set(families)
    assert 'odqa_requests_total{status="200"} 1.0' in text and 'odqa_requests_total{status="422"} 1.0' in text
    assert 'odqa_stage_seconds_count{stage="read"} 1.0' in text and "odqa_batch_size_count 1.0" in text
    assert "odqa_queue_depth 0.0" in text and "odqa_ready 1.0" in text


def test_health_says_loading_until_the_models_are_loaded():
    import threading
    loaded = threading.Event()

    def load():
        loaded.wait(10)
        return SlowPipeline(0.0)
    with TestClient(create_app(load=load)) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert client.post("/answer", json={"question": "q"}).status_code == 503
        loaded.set()
        for _ in range(100):
            if client.get("/health").status_code == 200:
                break
            threading.Event().wait(0.05)
        assert client.get("/health").json()["status"] == "ready"
        assert client.post("/answer", json={"question": "q"}).status_code == 200


def test_shutdown_finishes_the_requests_in_flight():
    import socket
    import threading
    import time

    import httpx
    import uvicorn
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(SlowPipeline(1.0)), host="127.0.0.1", port=port,
                                           log_level="warning", timeout_graceful_shutdown=10))
    thread = threading.Thread(target=server.run)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    result = {}
    asker = threading.Thread(target=lambda: result.update(r=httpx.post(f"http://127.0.0.1:{port}/answer",
                                                                       json={"question": "q"}, timeout=10)))
    asker.start()
    time.sleep(0.3)                   # the request is in its batch
    server.should_exit = True         # what SIGTERM does
    asker.join()
    thread.join(10)
    assert result["r"].status_code == 200 and result["r"].json()["generated"] == "x"


def test_the_page_asks_and_shows_both_answers_in_headless_chromium(system):
    """The page at / asks the question of its ?q= link and shows both answers and the marked passages."""
    import re
    import shutil
    import socket
    import subprocess
    import threading
    import time

    import uvicorn
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        assert not os.environ.get("ODQA_REQUIRE_BROWSER"), "ODQA_REQUIRE_BROWSER: no chromium on PATH (.ci/run installs it)"
        pytest.skip("no headless browser: `apt-get install chromium` (Debian) to run this test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(system["pipeline"]), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.02)
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                              "--virtual-time-budget=30000", "--dump-dom",
                              f"http://127.0.0.1:{port}/?q=how+tall+is+mount+everest&k=2"],
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        server.should_exit = True
        thread.join(10)
    answer = system["pipeline"].answer(["how tall is mount everest"], k=2)[0]
    shown = lambda id_: re.search(rf'id="{id_}"[^>]*>([^<]*)<', dom).group(1)  # noqa: E731
    assert shown("extractive") == answer["extractive"]["text"]
    assert shown("generated") == (answer["generated"] or "-")
    assert "retrieve " in shown("status") and "total " in shown("status")
    marks = re.findall(r"<mark>([^<]*)</mark>", dom)
    assert marks == [p["phrase"]["text"] for p in answer["passages"]]


class FussyPipeline(SlowPipeline):
    """Raises for a whole batch when any question in it contains "boom", as a tokenizer does on bad text."""

    def answer(self, questions, k=10, **settings):
        if any("boom" in q for q in questions):
            raise ValueError("cannot encode this question")
        return super().answer(questions, k, **settings)


def test_a_bad_request_batched_with_good_ones_fails_alone_and_input_is_checked_at_the_edge():
    import concurrent.futures
    fussy = FussyPipeline(0.2)
    with TestClient(create_app(fussy, max_batch=8, max_wait_ms=300)) as client:
        questions = ["good one", "boom here", "good two", "good three"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            rs = list(pool.map(lambda q: client.post("/answer", json={"question": q}), questions))
        assert [r.status_code for r in rs] == [200, 500, 200, 200]
        assert "cannot encode" in rs[1].json()["detail"]
        for bad in ("who \\ud800 x", "\\u200b\\u200b", "\\u00a0 \\t"):      # a lone surrogate; only invisible
            r = client.post("/answer", content=('{"question": "' + bad + '"}').encode(),
                            headers={"content-type": "application/json"})
            assert r.status_code == 422, (bad, r.text)
        r = client.post("/answer", json={"question": "x" * 10_000})
        assert r.status_code == 422 and len(r.content) < 1000        # the input is not echoed whole
        r = client.post("/answer", content=b'{"question": "' + b"x" * 20_000 + b'"}',
                        headers={"content-type": "application/json"})
        assert r.status_code == 413
    assert fussy.asked.count("boom here") == 0 and sorted(fussy.asked) == sorted(q for q in questions if "boom" not in q)


def test_health_names_no_absolute_paths(tmp_path, monkeypatch):
    from odqa.common.paths import odqa_home
    from odqa.system.commands.system import shown as _shown
    inside = odqa_home() / "runs" / "demo" / "phrase-index"
    assert _shown(inside) == "runs/demo/phrase-index"
    assert _shown(tmp_path / "elsewhere" / "reader") == "reader"


def test_serve_with_no_flags_serves_the_default_pipeline(system, monkeypatch):
    from odqa.common.defaults import record_pipeline
    from odqa.system.cli import main
    root = system["root"]
    record_pipeline({"corpus": system["corpus"], "phrase_model": root / "phrase", "phrase_index": root / "index",
                     "reader": root / "t5"}, by="test")
    served = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: served.update(app=app, **kw))
    assert main(["-q", "serve"]) == 0
    assert served["host"] == "127.0.0.1"
    with TestClient(served["app"]) as client:
        for _ in range(200):
            if client.get("/health").status_code == 200:
                break
            import time
            time.sleep(0.05)
        health = client.get("/health").json()
        assert health["status"] == "ready" and health["index"] == "index" and health["prefilter"] is None
        from odqa.common.device import pick_device
        from odqa.system.commands.system import SERVE_LIMITS
        assert (health["max_batch"], health["max_queue_s"]) == SERVE_LIMITS[pick_device()]   # the device's defaults
        r = client.post("/answer", json={"question": "how tall is mount everest", "k": 2})
        assert r.status_code == 200 and len(r.json()["passages"]) == 2


def test_a_kill_between_file_and_key_never_leaves_a_new_file_under_an_old_key(tmp_path):
    from odqa.common.artifact import cached_file as cached
    path = tmp_path / "retrieval.json"
    made = []

    def make(text, crash=False):
        def run():
            path.write_text(text)
            made.append(text)
            if crash:
                raise KeyboardInterrupt("killed after the file, before its key")
        return run
    cached(path, {"model": "a"}, make("from a"))
    with pytest.raises(KeyboardInterrupt):
        cached(path, {"model": "b"}, make("from b", crash=True))
    cached(path, {"model": "a"}, make("from a again"))     # the file on disk is b's: it must not be reused as a's
    assert made == ["from a", "from b", "from a again"] and path.read_text() == "from a again"


def test_serve_threads_sets_the_models_cpu_threads(system, monkeypatch):
    import torch

    from odqa.common.defaults import record_pipeline
    from odqa.system.cli import main
    root = system["root"]
    record_pipeline({"corpus": system["corpus"], "phrase_model": root / "phrase", "phrase_index": root / "index",
                     "reader": root / "t5"}, by="test")
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: None)
    before = torch.get_num_threads()
    try:
        assert main(["-q", "serve", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_serve_limits_follow_the_device_unless_flags_name_them():
    from odqa.system.commands.system import serve_limits
    assert serve_limits(None, None, "cpu") == (8, 1.0)      # a CPU batch of 8 costs 0.75x a question each
    assert serve_limits(None, None, "cuda") == (16, 1.0)
    assert serve_limits(1, 0.0, "cpu") == (1, 0.0)          # one at a time, when idle: the lowest latency
    assert serve_limits(8, -1.0, "cuda") == (8, -1.0)


def test_serve_with_two_workers_answers_and_metrics_count_both(system, tmp_path):
    """A real uvicorn with two worker processes on 127.0.0.1: both load and answer, and /metrics, from
    whichever worker it reaches, counts every worker's requests (Prometheus' multiprocess mode)."""
    import os
    import re
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx
    root = system["root"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "odqa.system.cli", "-q", "serve", "--workers", "2", "--port", str(port),
           "--index", str(root / "index"), "--model", str(root / "phrase"), "--reader", str(root / "t5"),
           "--corpus", str(system["corpus"]), "--threads", "1", "--max-queue-s", "-1"]
    server = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        workers = set()
        deadline = time.monotonic() + 180
        while len(workers) < 2 and time.monotonic() < deadline and server.poll() is None:
            try:
                text = httpx.get(f"{url}/metrics", timeout=5).text
                workers = set(re.findall(r'odqa_worker_ready\{pid="(\d+)"\} 1\.0', text))
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert len(workers) == 2, server.stdout.read() if server.poll() is not None else "not ready in time"
        from concurrent.futures import ThreadPoolExecutor

        def ask(_):   # a connection a request, four at a time: the workers share them out
            return httpx.post(f"{url}/answer", json={"question": "how tall is mount everest", "k": 2},
                              timeout=60).status_code
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(ask, range(24))) == [200] * 24
        text = httpx.get(f"{url}/metrics", timeout=10).text
        assert re.search(r'odqa_requests_total\{status="200"\} 24\.0', text), text
        per_worker = {pid: float(n) for pid, n in re.findall(r'odqa_worker_requests\{pid="(\d+)"\} (\S+)', text)}
        # each worker answered some, and the total counts them all
        assert per_worker.keys() == workers and min(per_worker.values()) > 0 and sum(per_worker.values()) == 24, per_worker
    finally:
        os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=60)
    assert not list(tmp_path.glob("odqa-serve-metrics-*"))


def test_the_reports_f1_is_left_out_for_regex_answers_and_for_records_written_before_it():
    """CuratedTREC's answers are patterns, for which the papers give EM alone; a report made from a
    questions.jsonl written before F1 was reads "-" there too, and every other figure as it was."""
    from odqa.system.report import markdown, table_rows
    k = {"1": {"generated": "x", "generated_em": False, "hit": True}}
    old = [{"dataset": "nq", "id": "1", "question": "q", "answers": ["x y"], "extractive": "x", "extractive_em": False,
            "k": k}]
    regex = [{**old[0], "dataset": "curated", "extractive_f1": None, "k": {"1": {**k["1"], "generated_f1": None}}}]
    new = [{**old[0], "extractive_f1": 2 / 3, "k": {"1": {**k["1"], "generated_f1": 2 / 3}}}]
    rows = table_rows(old + regex + new)
    assert [r["generated F1"] for r in rows] == [None, None] and rows[0]["Top-k"] == 100.0
    assert markdown(rows).splitlines()[2].endswith("| 0 | 0 | - | - |")
    assert table_rows(new)[0]["extractive F1"] == pytest.approx(66.67, abs=0.01)


def test_nq_is_scored_against_nq_opens_answers_beside_dprs_and_the_report_says_which(tmp_path):
    """DPR's NQ answers are PTB-tokenised: "1950 - 51" normalises to "1950 51", NQ-open's "1950-51" to "195051",
    and FiD's published EM scores the latter. A question set with answers_raw gets both, labelled."""
    from odqa.common.results import ReadAtK, RunQuestion
    from odqa.system.report import LEGEND, RAW_COLUMNS, markdown, table_rows
    record = RunQuestion("nq-test", "1", "q", ("1950 - 51",), "1950-51", False,
                         {5: ReadAtK("1950-51", False, True, 0.0, True)}, 0.0, answers_raw=("1950-51",),
                         extractive_em_raw=True)
    lines = [record.to_dict(), {**RunQuestion("tqa-test", "2", "q", ("x",), "x", True, {5: ReadAtK("x", True, True)}).to_dict()}]
    assert RunQuestion.from_dict(lines[0]) == record
    rows = table_rows(lines)
    assert rows[0]["generated EM"] == 0.0 and rows[0][RAW_COLUMNS[1]] == 100.0 and rows[0][RAW_COLUMNS[0]] == 100.0
    assert RAW_COLUMNS[0] not in rows[1]
    text = markdown(rows)
    assert text.splitlines()[0].endswith(f"| {RAW_COLUMNS[0]} | {RAW_COLUMNS[1]} |")
    assert text.splitlines()[3].endswith("| - | - |") and text.endswith(LEGEND)


def test_a_run_with_other_arguments_never_leaves_the_old_report_beside_its_files(system, tmp_path, monkeypatch):
    """`odqa run` into an --out holding another run's report (here of --limit 4) removes that report before
    it starts: a run with --limit 2 cut short leaves its own files and no report of 4 questions."""
    from tiny_data import write_jsonl

    from odqa.common.io import InputError
    from odqa.system.args import RunArgs
    from odqa.system.run import run
    root = system["root"]
    questions = write_jsonl(tmp_path / "q.jsonl", TINY_QUESTIONS)

    def args(limit):
        return from_flat(RunArgs, dict(out_dir=str(tmp_path / "run"), questions=[str(questions)], k=[2], limit=limit, baselines=["none"],
                       index=str(root / "index"), model=str(root / "phrase"), reader=str(root / "t5"),
                       corpus=str(system["corpus"]), no_prefilter=True, no_reranker=True, no_memory=True))
    run(args(4))
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["rows"] and (tmp_path / "run" / "report.md").exists()

    def cut(*a, **k):
        raise InputError("cut short")
    monkeypatch.setattr("odqa.system.run.read", cut)
    with pytest.raises(InputError, match="cut short"):
        run(args(2))
    assert not (tmp_path / "run" / "report.json").exists() and not (tmp_path / "run" / "report.md").exists()
    assert json.loads((tmp_path / "run" / "run_args.json").read_text())["evaluation"]["limit"] == 2


def test_nan_or_infinity_in_a_body_is_a_422_naming_it():
    # Python's json reads NaN and Infinity, which JSON has not: echoed back as they came, the 422 was a 500.
    with TestClient(create_app(SlowPipeline(0.01), max_batch=1)) as client:
        for body, said in (('{"question": "q", "k": NaN}', "valid integer"),
                           ('{"question": "q", "settings": {"lam": NaN}}', "must be a finite number"),
                           ('{"question": "q", "settings": {"memory_threshold": -Infinity}}', "must be a finite number")):
            r = client.post("/answer", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422 and said in r.text, (body, r.status_code, r.text)
        assert 'odqa_requests_total{status="422"} 3.0' in client.get("/metrics").text
