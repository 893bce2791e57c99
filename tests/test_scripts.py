"""The diagnostic scripts' own logic, on hand-made files."""
import importlib.util
import json
from pathlib import Path

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
    entries = [
        {"id": "a", "answers": ["Paris"], "prediction": "Paris", "ctxs": [_ctx("Paris is big", True), _ctx("Lyon", False)]},
        {"id": "b", "answers": ["Paris"], "prediction": "Lyon", "ctxs": [_ctx("Lyon", False), _ctx("Paris, Nice", True)]},
        {"id": "c", "answers": ["Paris"], "prediction": "", "ctxs": [_ctx("Nice and Paris", True), _ctx("Nice", False)]},
        {"id": "d", "answers": ["Rome"], "prediction": "Rome", "ctxs": [_ctx("Oslo", False), _ctx("Rome", True)]},
        {"id": "e", "answers": ["Bern"], "prediction": "", "ctxs": [_ctx("Oslo", False)]},
    ]
    preds = {"a": "Paris", "b": "Lyon", "c": "Nice", "d": "Oslo", "e": "Oslo"}
    (tmp_path / "r.json").write_text(json.dumps(entries))
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": i, "prediction": p, "em": p in e["answers"]}) + "\n"
                                              for (i, p), e in zip(preds.items(), entries)))
    row = errors.breakdown(entries, {i: {"prediction": p, "em": p == e["answers"][0]} for (i, p), e in
                                     zip(preds.items(), entries)}, k=2)
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
