"""Records are read through their schema and store paths that move with their home: a copied
$ODQA_HOME (cp -a, the original deleted) answers with its own files, a pipeline record of the wrong
shape is an error naming the file and the field in the commands that read it (never in --help), and a
recorded part that is gone is refused by name, never left out."""
import json
import shutil
import time

import pytest
from tiny_data import TINY_QUESTIONS, write_jsonl
from tiny_models import make_tiny_system

from odqa.common.defaults import pipeline_file, record_pipeline
from odqa.system.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home holding the tiny system, recorded as its default pipeline with an answer memory."""
    home = tmp_path / "home"
    monkeypatch.setenv("ODQA_HOME", str(home))
    (home / "runs").mkdir(parents=True)
    world = make_tiny_system(home / "runs")
    assert main(["-q", "build-memory", "--model", str(world["phrase"]), "--questions",
                 str(write_jsonl(home / "train-q.jsonl", TINY_QUESTIONS[:3])), "--out", str(home / "memory")]) == 0
    record_pipeline({"corpus": world["corpus"], "phrase_model": world["phrase"], "phrase_index": world["index"],
                     "reader": world["t5"], "memory": home / "memory"}, by="test")
    return home


def test_a_record_stores_paths_inside_the_home_relative_to_itself(home):
    recorded = json.loads(pipeline_file().read_text())
    assert recorded["phrase_model"] == "runs/phrase" and recorded["memory"] == "memory"
    assert not any(str(home) in str(v) for v in recorded.values())


def test_a_copied_home_answers_with_its_own_files_once_the_original_is_gone(home, tmp_path, monkeypatch, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(home, copy, symlinks=True)        # cp -a
    shutil.rmtree(home)
    monkeypatch.setenv("ODQA_HOME", str(copy))
    question = TINY_QUESTIONS[0]["question"]
    assert main(["ask", question, "--k", "2"]) == 0
    out = capsys.readouterr().out
    assert "extractive:" in out and "generated:" in out
    questions = write_jsonl(tmp_path / "q.jsonl", TINY_QUESTIONS[3:])
    assert main(["-q", "run", "--out", str(tmp_path / "run"), "--questions", str(questions), "--k", "2",
                 "--baselines", "none"]) == 0
    assert json.loads((tmp_path / "run" / "report.json").read_text())["rows"]
    run_args = json.loads((tmp_path / "run" / "run_args.json").read_text())
    assert run_args["parts"]["model"].startswith(str(copy)) and run_args["parts"]["reader"].startswith(str(copy))

    from fastapi.testclient import TestClient

    from odqa.system.cli import parse_args
    from odqa.system.commands.system import serve_app
    with TestClient(serve_app(parse_args(["serve"]))) as client:
        for _ in range(400):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        health = client.get("/health").json()
        assert health["status"] == "ready" and health["index"] == "runs/index"
        assert client.post("/answer", json={"question": question, "k": 2}).status_code == 200


@pytest.mark.parametrize("record, said", [
    ([1, 2, 3], "not a pipeline record (the record: Input should be a valid dictionary"),
    ({"supervision": 5}, "not a pipeline record (supervision: Input should be a valid string"),
    ({"phrase_model": "runs/phrase", "extra": "x"}, "not a pipeline record (extra: Extra inputs are not permitted"),
    ({"settings": [1]}, "not a pipeline record (settings: Input should be a valid dictionary"),
])
def test_a_record_of_the_wrong_shape_is_named_where_it_is_read_and_help_still_works(home, capsys, record, said):
    pipeline_file().write_text(json.dumps(record))
    assert main(["ask", "who"]) == 2
    err = capsys.readouterr().err
    assert f"{pipeline_file()}: {said}" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as helped:
        main(["--help"])
    assert helped.value.code == 0
    with pytest.raises(SystemExit) as helped:
        main(["train-phrase", "--help"])
    assert helped.value.code == 0


def test_a_recorded_part_that_is_gone_is_refused_by_name(home, capsys):
    shutil.rmtree(home / "memory")
    assert main(["ask", TINY_QUESTIONS[0]["question"], "--k", "2"]) == 2
    assert f"records the answer memory at {home / 'memory'}, which is not there" in capsys.readouterr().err
    assert main(["ask", TINY_QUESTIONS[0]["question"], "--k", "2", "--no-memory"]) == 0


def test_a_stage_record_of_the_wrong_shape_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ODQA_HOME", str(tmp_path / "home"))
    (tmp_path / "out" / "stages").mkdir(parents=True)
    (tmp_path / "out" / "stages" / "data.json").write_text("[1]")
    assert main(["demo", "--plan", "--out", str(tmp_path / "out")]) == 2
    assert "stages/data.json: not a stage record" in capsys.readouterr().err


def test_read_takes_the_default_pipelines_reader_unless_given_one(home, tmp_path, capsys, monkeypatch):
    """`odqa read` without --model reads with the default pipeline's reader, as every other command takes the
    pipeline's parts; with no pipeline recorded, it says how to make one."""
    from tiny_data import code_world
    fid = write_jsonl(tmp_path / "fid.jsonl", code_world(3, 2, 0))
    argv = ["-q", "read", "--input", str(fid), "--k", "2", "--max-new-tokens", "3"]
    assert main([*argv, "--out", str(tmp_path / "default.jsonl")]) == 0
    from odqa.system.pipeline import pipeline_record
    reader = pipeline_record()[1]["reader"]
    assert main([*argv, "--out", str(tmp_path / "given.jsonl"), "--model", str(reader)]) == 0
    assert (tmp_path / "default.jsonl").read_text() == (tmp_path / "given.jsonl").read_text()
    capsys.readouterr()
    monkeypatch.setenv("ODQA_HOME", str(tmp_path / "empty"))
    assert main([*argv, "--out", str(tmp_path / "none.jsonl")]) == 2
    assert "no pipeline record at" in capsys.readouterr().err
