"""The diagnostic scripts' own logic, on hand-made files."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from odqa.common.io import InputError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ctx(text: str, has_answer: bool) -> dict:
    return {"id": text, "title": "T", "text": text, "has_answer": has_answer}


def test_reader_errors_puts_each_wrong_answer_down_to_the_passages_that_spell_it(tmp_path, capsys, monkeypatch):
    errors = _script("reader_errors")
    rows = [("a", "Paris", "Paris", [_ctx("Paris is big", True), _ctx("Lyon", False)], "Paris"),
            ("b", "Paris", "Lyon", [_ctx("Lyon", False), _ctx("Paris, Nice", True)], "Lyon"),
            ("c", "Paris", "", [_ctx("Nice and Paris", True), _ctx("Nice", False)], "Nice"),
            ("d", "Rome", "Rome", [_ctx("Oslo", False), _ctx("Rome", True)], "Oslo"),
            ("e", "Bern", "", [_ctx("Oslo", False)], "Oslo")]
    entries = [{"id": i, "question": f"q {i}", "answers": [a], "prediction": ext, "ctxs": ctxs}
               for i, a, ext, ctxs, _ in rows]
    preds = {i: {"id": i, "prediction": gen, "em": gen == a} for i, a, _, _, gen in rows}
    (tmp_path / "r.json").write_text(json.dumps(entries))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds.values()))
    row = errors.breakdown(entries, preds, k=2)
    assert (row["answerable"], row["right"], row["wrong from negative"], row["wrong from positive"],
            row["wrong from both"]) == (4, 1, 2, 0, 1)
    assert (row["extractive_right"], row["generated_right"], row["both_right"], row["either_right"]) == (2, 1, 1, 2)
    with pytest.raises(InputError, match="no prediction for a"):
        errors.breakdown(entries, {}, k=2)
    argv = ["reader_errors", "--retrieval", str(tmp_path / "r.json"), "--predictions", str(tmp_path / "p.jsonl"),
            "--k", "2"]
    monkeypatch.setattr("sys.argv", argv)
    assert errors.main() == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["wrong from both"] == 1
    monkeypatch.setattr("sys.argv", argv[:2] + [str(tmp_path / "missing.json")] + argv[3:])
    assert errors.main() == 2 and "missing.json" in capsys.readouterr().err


def test_read_answerable_oracle_keeps_the_answer_bearing_passages_in_order(monkeypatch, capsys):
    read = _script("read_answerable")
    ctxs = [_ctx("x", False), _ctx("y", True), _ctx("z", False), _ctx("w", True)]
    assert [c["text"] for c in read.oracle_passages(ctxs, "all")] == ["y", "w"]
    assert [c["text"] for c in read.oracle_passages(ctxs, "first")] == ["y"]
    assert read.oracle_passages(ctxs[:1], "all") == []
    monkeypatch.setattr("sys.argv", ["read_answerable", "--model", "m", "--retrieval", "r.json", "--out-dir", "o",
                                     "--oracle", "all", "--ks", "5", "10"])
    with pytest.raises(SystemExit):
        read.main()
    assert "one k" in capsys.readouterr().err


def test_overlap_em_splits_each_files_right_answers_by_part(tmp_path, capsys, monkeypatch):
    overlap = _script("overlap_em")
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(q) + "\n" for q in [
        {"question": "who wrote hamlet", "answers": ["William Shakespeare"]},
        {"question": "capital city of france", "answers": ["Paris"]}]))
    tests = [("a", "who was the author of hamlet", "William Shakespeare", "William Shakespeare", True),
             ("b", "who wrote hamlet", "William Shakespeare", "Marlowe", False),
             ("c", "largest city in france", "Paris", "Paris", True),
             ("d", "who painted the mona lisa", "Leonardo", "Leonardo", False)]
    entries = [{"id": i, "question": q, "answers": [a], "prediction": ext, "ctxs": [_ctx(a, hit)]}
               for i, q, a, ext, hit in tests]
    (tmp_path / "r.json").write_text(json.dumps(entries))
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps({"id": i, "question": q, "answers": [a], "em": i != "d"})
                                                 + "\n" for i, q, a, _, _ in tests))
    argv = ["overlap_em", "--train", str(tmp_path / "train.jsonl"), "--retrieval", str(tmp_path / "r.json"),
            "--predictions", str(tmp_path / "gen.jsonl"), "--threshold", "0.7", "--k", "1"]
    monkeypatch.setattr("sys.argv", argv)
    assert overlap.main() == 0
    rows = {r["part"]: r for r in json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]}
    assert {part: (r["questions"], r["top-k"], r["extractive"], r["gen"]) for part, r in rows.items()} == {
        "question overlap": (1, 0, 0, 1), "answer overlap only": (2, 2, 2, 2), "no overlap": (1, 0, 1, 0),
        "all": (4, 2, 3, 3)}
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "gen.jsonl").write_text((tmp_path / "gen.jsonl").read_text())
    monkeypatch.setattr("sys.argv", argv[:-4] + [str(tmp_path / "run2" / "gen.jsonl")] + argv[-4:])
    assert overlap.main() == 0
    assert {"gen", "run2/gen"} <= set(json.loads(capsys.readouterr().out.splitlines()[-1])["rows"][0])
    monkeypatch.setattr("sys.argv", argv[:-4] + [str(tmp_path / "gen.jsonl")] + argv[-4:])
    assert overlap.main() == 2 and "given twice" in capsys.readouterr().err
    (tmp_path / "short.jsonl").write_text(json.dumps({"id": "a", "question": "q", "answers": ["x"], "em": 1}) + "\n")
    monkeypatch.setattr("sys.argv", argv[:-4] + [str(tmp_path / "short.jsonl")] + argv[-4:])
    assert overlap.main() == 2 and "short: no answer for 3" in capsys.readouterr().err
    # more questions than the first file's: of another set, refused
    (tmp_path / "more.jsonl").write_text((tmp_path / "gen.jsonl").read_text() + json.dumps(
        {"id": "e", "question": "q", "answers": ["x"], "em": 1}) + "\n")
    monkeypatch.setattr("sys.argv", argv[:-4] + [str(tmp_path / "more.jsonl")] + argv[-4:])
    assert overlap.main() == 2 and "more: 1 questions the first file does not hold" in capsys.readouterr().err
    # a Top-k the file cannot have, and flags out of range
    monkeypatch.setattr("sys.argv", argv[:-2] + ["--k", "10"])
    assert overlap.main() == 2 and "at most 1 passages a question, so it has no Top-10" in capsys.readouterr().err
    for bad, said in ((["--k", "0"], "argument --k: must be at least 1, not 0"),
                      (["--k", "-5"], "argument --k: must be at least 1, not -5"),
                      (["--threshold", "5"], "argument --threshold: must be between 0 and 1, not 5")):
        monkeypatch.setattr("sys.argv", argv[:-4] + bad)
        with pytest.raises(SystemExit) as refused:
            overlap.main()
        assert refused.value.code == 2 and said in capsys.readouterr().err


def test_bench_prefilter_searches_its_synthetic_index_both_ways(monkeypatch, capsys):
    import numpy as np
    bench = _script("bench_prefilter")
    rng = np.random.default_rng(0)
    s = bench.synthetic_searcher(400, 10, 16, 32, rng)
    qs, qe = (rng.standard_normal((3, 32), dtype=np.float32) for _ in range(2))
    from odqa.retriever.phrase_search import id_ranges
    a = s.artifacts
    every = [s.every_phrase(q, e, id_ranges(a.doc_vec_start, a.doc_vec_end)) for q, e in zip(qs, qe)]   # exact
    hits = s.mips(qs, qe, 20)
    for exact, found in zip(every, hits):
        assert len(exact) == 400 * 16 and found.score[0] <= exact.score[0] + 1e-4
    monkeypatch.setattr("sys.argv", ["bench_prefilter", "--passages", "400", "--top-docs", "5", "--k", "10",
                                     "--batch", "4", "--repeats", "1", "--dim", "32", "--doc-dim", "16"])
    assert bench.main() == 0
    assert "| 400 | 40 | 6,400 |" in capsys.readouterr().out


def test_bench_build_memory_writes_a_dump_that_build_index_reads(tmp_path):
    from search_helpers import index_of

    from odqa.retriever.phrase_dump import read_dump
    bench = _script("bench_build_memory")
    dump, corpus, dump_bytes = bench.synthetic_dump(tmp_path, 300, 5, 8, chunk_passages=64)
    arrays, summary = read_dump(dump, corpus)
    assert len(arrays["token"]) == 1500 and dump_bytes > 1500 * 8 * 2 * 2
    m = index_of(dump, tmp_path / "index", corpus, factory="Flat", keep=0.2)
    assert m["vectors"] == pytest.approx(300, abs=2) and m["passages"] == 300


def test_bench_bm25_builds_both_ways_and_checks_the_rerank_scores(tmp_path):
    bench = _script("bench_bm25")
    vocabulary = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"])
    corpus = bench.synthetic_corpus(tmp_path, 300, 20, vocabulary)
    assert bench.peak_mb("old", corpus) > 0 and bench.peak_mb("new", corpus) > 0
    whole, rows = bench.rerank_ms(corpus, vocabulary, 10, 50)   # exits if the two ways' scores differ
    assert whole > 0 and rows > 0


def test_bench_answer_index_finds_the_same_passages_both_ways(tiny_corpus, tiny_questions):
    bench = _script("bench_answer_index")
    old, new = (bench.measure(mode, str(tiny_corpus), [str(tiny_questions)]) for mode in ("old", "new"))
    assert old["found"] == new["found"] and any(old["found"]) and min(old["peak_mb"], new["peak_mb"]) > 0


def test_gpu_check_runs_every_stage_on_the_cpu_and_every_check_passes(tmp_path):
    """scripts/gpu_check.py, the prepared check for a GPU node, at its --cpu sizes: the same code runs every
    stage (bf16 dumping, the accelerated index training's wiring, both whole-index searches, FiD under
    ZeRO-2 in bf16 and ZeRO-3 with DeepSpeedCPUAdam's offload, generation), so it cannot rot before the day
    a GPU is lent."""
    import os
    import subprocess
    import sys
    # a process of its own, as on a node: not the launcher variables (and port) of trainers run earlier in this one
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check.py"), "--cpu", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert len(report["checks"]) == 8 and all(c["passed"] for c in report["checks"])
    assert set(report["results"]["reader training"]) == {"ZeRO-2 bf16", "ZeRO-3 + CPU offload"}
    assert "| two searches of one index agree |" in done.stdout
