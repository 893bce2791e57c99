"""Bad input never ends in a traceback or a wrong answer: twenty inputs that once ended in a traceback are
each refused with one line naming them (exit 2), `--debug` shows the traceback behind it, corrupted indexes are
refused by their checksums, and random bytes and JSON given to every input reader give a named InputError
or a result, never another exception."""
import csv
import gzip
import io
import json
import os
import shutil
import string
import tempfile
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from search_helpers import index_of
from tiny_data import TINY_DOCS, TINY_QUESTIONS, code_world, write_jsonl
from tiny_models import make_tiny_bert, make_tiny_t5

from odqa.common.corpus import build_corpus
from odqa.common.io import InputError
from odqa.common.questions import load_questions
from odqa.common.retrieval_eval import evaluate_results
from odqa.common.retrieval_file import read_results
from odqa.reader.fid_data import load_fid_file
from odqa.retriever.args import PhraseModelConfig
from odqa.retriever.lm import load_tokenizer
from odqa.retriever.phrase_dump import dump_phrases
from odqa.retriever.phrase_index import PhraseIndex
from odqa.retriever.phrase_model import DensePhraseModel
from odqa.retriever.searcher import Searcher
from odqa.system.cli import main


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """A corpus, an (untrained) phrase model and its Flat index, a tiny T5 reader and a FiD file, each with
    broken copies: the inputs of TABLE."""
    root = tmp_path_factory.mktemp("bad_input")
    docs = write_jsonl(root / "docs.jsonl", TINY_DOCS)
    corpus = root / "corpus"
    build_corpus([docs], corpus)
    texts = [p for d in TINY_DOCS for s in d["sections"] for p in s["paragraphs"]] + \
        [q["question"] for q in TINY_QUESTIONS]
    bert = make_tiny_bert(root / "bert", texts)
    model = root / "phrase"
    DensePhraseModel(PhraseModelConfig(encoder=str(bert), max_passage_tokens=64)).save_pretrained(
        model, tokenizer=load_tokenizer(bert))
    dump_phrases(model, corpus, root / "dump")
    index_of(root / "dump", root / "index", corpus)
    k = {"root": root, "corpus": corpus, "model": model, "index": root / "index"}

    (root / "gzip.jsonl").write_bytes(gzip.compress(b'{"id": "a", "title": "t", "text": "x"}\n'))
    (root / "latin1.jsonl").write_bytes('{"id": "a", "title": "t", "text": "café"}\n'.encode("latin-1"))
    (root / "surrogate.jsonl").write_text('{"id": "a", "title": "t", "text": "x \\ud800 y"}\n')
    (root / "good.jsonl").write_text('{"id": "a", "title": "t", "text": "hello world"}\n')
    (root / "binary.json").write_bytes(gzip.compress(json.dumps([{"question": "q", "ctxs": []}]).encode()))
    (root / "dpr.qa.csv").write_text("who wrote hamlet\t['Shakespeare']\nwho painted the mona lisa\n")
    (root / "binary-q.jsonl").write_bytes(gzip.compress(b'{"question": "q", "answers": ["a"]}\n'))
    write_jsonl(root / "q.jsonl", TINY_QUESTIONS)
    (root / "run.json").write_text(json.dumps([{"question": "q", "answers": ["a"], "ctxs": [
        {"id": "1", "title": "t", "text": "a b", "score": 1.0, "has_answer": True}]}]))
    (root / "deep-q.jsonl").write_text('{"question": "q", "answers": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (root / "bigint-q.jsonl").write_text('{"id": ' + "7" * 5000 + ', "question": "q", "answers": ["a"]}\n')
    (root / "deep-fid.json").write_text("[" * 100_000 + "]" * 100_000 + "\n")

    def broken_model(name, edit):
        """A copy edited by hand, without the checksums that would refuse any edit (tests/test_damaged_checkpoints.py):
        the checks behind them, for a checkpoint that has none."""
        out = root / name
        shutil.copytree(model, out)
        (out / "checksums.json").unlink()
        edit(out)
        return out
    k["model_bad_json"] = broken_model("m_json", lambda d: (d / "phrase_config.json").write_text('{"encoder": '))
    k["model_no_key"] = broken_model("m_key", lambda d: (d / "phrase_config.json").write_text(
        json.dumps({k: v for k, v in json.loads((model / "phrase_config.json").read_text()).items() if k != "encoder"})))
    k["model_bad_heads"] = broken_model("m_heads", lambda d: torch.save(
        {key: torch.zeros(3, 5) for key in torch.load(d / "phrase_heads.pt")}, d / "phrase_heads.pt"))

    def wrong_kind(d):
        shutil.rmtree(d / "phrase_lm")
        make_tiny_t5(d / "phrase_lm", texts, vocab_size=300)
    k["model_wrong_lm"] = broken_model("m_kind", wrong_kind)

    k["index_truncated"] = root / "index_truncated"
    shutil.copytree(root / "index", k["index_truncated"])
    meta = k["index_truncated"] / "meta.npz"
    meta.write_bytes(meta.read_bytes()[:100])

    def broken_index(name, edit):
        out = root / name
        shutil.copytree(root / "index", out)
        manifest = json.loads((out / "manifest.json").read_text())
        (out / "manifest.json").write_text(json.dumps(edit(manifest)))
        k[name] = out
    broken_index("index_manifest_number", lambda m: 5)
    broken_index("index_entry_no_bytes", lambda m: {**m, "files": {n: {"sha256": f["sha256"]} for n, f in m["files"].items()}})
    broken_index("index_files_number", lambda m: {**m, "files": 3})
    broken_index("index_vectors_text", lambda m: {**m, "vectors": "many"})
    broken_index("index_no_files", lambda m: {n: v for n, v in m.items() if n != "files"})
    broken_index("index_file_unrecorded", lambda m: {**m, "files": {n: f for n, f in m["files"].items() if n != "meta.npz"}})

    reader = make_tiny_t5(root / "reader", texts, vocab_size=300)
    k["reader"] = reader
    k["reader_truncated"] = root / "reader_truncated"
    shutil.copytree(reader, k["reader_truncated"])
    weights = k["reader_truncated"] / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    rows = code_world(3, 2, 0)
    write_jsonl(root / "fid.jsonl", rows)
    rows[1]["ctxs"][0]["score"] = "abc"
    write_jsonl(root / "fid-bad-score.jsonl", rows)
    rows = code_world(3, 2, 0)
    write_jsonl(root / "fid-dup.jsonl", [rows[0], rows[1], {**rows[2], "id": rows[0]["id"]}])
    write_jsonl(root / "fid-empty.jsonl", [rows[0], {**rows[1], "ctxs": []}])
    return k


# The inputs: (command, argv, what the one-line error says). `{name}` is a path of the kit.
TABLE = [
    ("corpus build, a gzip file", "corpus build --input {root}/gzip.jsonl --out {tmp}/c", "gzip.jsonl:1: not UTF-8 text (byte 1 is 0x8b)"),
    ("corpus build, Latin-1", "corpus build --input {root}/latin1.jsonl --out {tmp}/c", "latin1.jsonl:1: not UTF-8 text (byte 38 is 0xe9)"),
    ("corpus build, a lone surrogate", "corpus build --input {root}/surrogate.jsonl --out {tmp}/c", "surrogate.jsonl:1: a lone surrogate escape"),
    ("corpus build --max-words 0", "corpus build --input {root}/good.jsonl --out {tmp}/c --max-words 0", "argument --max-words: must be at least 1, not 0"),
    ("corpus build --max-words -1", "corpus build --input {root}/good.jsonl --out {tmp}/c --max-words -1", "argument --max-words: must be at least 1, not -1"),
    ("dump-phrases --batch-size 0", "dump-phrases --model {model} --corpus {corpus} --out {tmp}/d --batch-size 0", "argument --batch-size: must be at least 1"),
    ("dump-phrases --chunk-passages 0", "dump-phrases --model {model} --corpus {corpus} --out {tmp}/d --chunk-passages 0", "argument --chunk-passages: must be at least 1"),
    ("dump-phrases, malformed config", "dump-phrases --model {model_bad_json} --corpus {corpus} --out {tmp}/d", "m_json/phrase_config.json:1: not valid JSON"),
    ("dump-phrases, config missing a key", "dump-phrases --model {model_no_key} --corpus {corpus} --out {tmp}/d", "m_key/phrase_config.json: no 'encoder'"),
    ("dump-phrases, heads of the wrong shape", "dump-phrases --model {model_bad_heads} --corpus {corpus} --out {tmp}/d", "m_heads/phrase_heads.pt: filter_head.weight has shape (3, 5)"),
    ("dump-phrases, a T5 as the phrase LM", "dump-phrases --model {model_wrong_lm} --corpus {corpus} --out {tmp}/d", "m_kind/phrase_lm: a 't5' model; the phrase and question encoders need an encoder-only"),
    ("eval-retrieval, a binary run file", "eval-retrieval {root}/binary.json --corpus {corpus}", "binary.json: not UTF-8 text (byte 1 is 0x8b)"),
    ("retrieve, a binary question file", "retrieve --questions {root}/binary-q.jsonl --corpus {corpus} --out {tmp}/r.json", "binary-q.jsonl:1: not UTF-8 text"),
    ("retrieve, a DPR question line without answers", "retrieve --questions {root}/dpr.qa.csv --corpus {corpus} --out {tmp}/r.json",
     "dpr.qa.csv:2: expected a JSON object or DPR's question<TAB>['answer', ...], got 1 tab-separated fields"),
    ("retrieve, JSON nested too deeply", "retrieve --questions {root}/deep-q.jsonl --corpus {corpus} --out {tmp}/r.json", "deep-q.jsonl:1: JSON nested too deeply to read"),
    ("retrieve, a 5,000-digit question id", "retrieve --questions {root}/bigint-q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "bigint-q.jsonl:1: not readable JSON (Exceeds the limit (4300 digits)"),
    ("read, JSON nested too deeply", "read --model {reader} --input {root}/deep-fid.json --out {tmp}/p.jsonl", "deep-fid.json: JSON nested too deeply to read"),
    ("retrieve --batch-size 0", "retrieve --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json --batch-size 0", "argument --batch-size: must be at least 1"),
    ("retrieve --k -3", "retrieve --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json --k -3", "argument --k: must be at least 1, not -3"),
    ("a truncated meta.npz", "retrieve --retriever phrase --index {index_truncated} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "index_truncated/meta.npz: "),
    ("an index manifest that is a number", "retrieve --retriever phrase --index {index_manifest_number} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "index_manifest_number/manifest.json: not a phrase index manifest (a JSON int, not an object)"),
    ("an index manifest entry without bytes", "retrieve --retriever phrase --index {index_entry_no_bytes} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "index_entry_no_bytes/manifest.json: the entry of 'end.faiss' is not {{\"bytes\": a size, \"sha256\": a hash}}"),
    ("verify, a manifest entry without bytes", "verify {index_entry_no_bytes}",
     "index_entry_no_bytes/manifest.json: the entry of 'end.faiss' is not {{\"bytes\": a size"),
    ("verify, a manifest whose files are a number", "verify {index_files_number}", "index_files_number/manifest.json: its \"files\" are int, not a table of files"),
    ("an index manifest counting in words", "retrieve --retriever phrase --index {index_vectors_text} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "index_vectors_text/manifest.json: its 'vectors' is 'many', not a count"),
    ("an index manifest stripped of its files", "retrieve --retriever phrase --index {index_no_files} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "corrupt phrase index: {index_no_files}/start.faiss is not in the manifest's files, so it cannot be checked"),
    ("an index manifest leaving out a file it reads", "retrieve --retriever phrase --index {index_file_unrecorded} --model {model} --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json",
     "corrupt phrase index: {index_file_unrecorded}/meta.npz is not in the manifest's files"),
    ("read --k 0", "read --model {reader} --input {root}/fid.jsonl --out {tmp}/p.jsonl --k 0", "argument --k: must be at least 1, not 0"),
    ("read --k -2", "read --model {reader} --input {root}/fid.jsonl --out {tmp}/p.jsonl --k -2", "argument --k: must be at least 1, not -2"),
    ("read, a score that is not a number", "read --model {reader} --input {root}/fid-bad-score.jsonl --out {tmp}/p.jsonl", "fid-bad-score.jsonl:2: ctx 0: \"score\" is not a number: 'abc'"),
    ("read, a question with no ctxs", "read --model {reader} --input {root}/fid-empty.jsonl --out {tmp}/p.jsonl", "fid-empty.jsonl: 1 question(s) with no ctxs"),
    ("read, an id twice", "read --model {reader} --input {root}/fid-dup.jsonl --out {tmp}/p.jsonl", "fid-dup.jsonl: question id(s) given twice"),
    ("train-reranker --negatives 0", "train-reranker --train-file {root}/q.jsonl --validation-file {root}/q.jsonl --out {tmp}/rr --negatives 0", "argument --negatives: must be at least 1, not 0"),
    ("train-reranker --negatives -2", "train-reranker --train-file {root}/q.jsonl --validation-file {root}/q.jsonl --out {tmp}/rr --negatives -2", "argument --negatives: must be at least 1, not -2"),
    ("train-reranker --lr -1", "train-reranker --train-file {root}/q.jsonl --validation-file {root}/q.jsonl --out {tmp}/rr --lr -1", "argument --lr: must be above 0, not -1"),
    ("train-reader --lr -1", "train-reader --train-file {root}/fid.jsonl --out {tmp}/r --lr -1", "argument --lr: must be at least 0, not -1"),
    ("train-phrase --warmup-ratio 2", "train-phrase --train-file {root}/q.jsonl --validation-file {root}/q.jsonl --out {tmp}/p --warmup-ratio 2", "argument --warmup-ratio: must be between 0 and 1, not 2"),
    ("build-memory --out a file", "build-memory --out {root}/good.jsonl", "argument --out: {root}/good.jsonl: a file is there; this writes a directory"),
    ("eval-retrieval --json a directory", "eval-retrieval {root}/run.json --corpus {corpus} --json {corpus}", "a directory is there; this writes a file"),
    ("retrieve --out under a file", "retrieve --questions {root}/q.jsonl --corpus {corpus} --out {root}/good.jsonl/r.json",
     "{root}/good.jsonl is a file, so nothing can be written under it"),
    ("eval-retrieval --json under a file", "eval-retrieval {root}/run.json --corpus {corpus} --json {root}/good.jsonl/m/m.json",
     "{root}/good.jsonl is a file, so nothing can be written under it"),
    ("read --out under a file", "read --model {reader} --input {root}/fid.jsonl --out {root}/good.jsonl/p.jsonl",
     "{root}/good.jsonl is a file, so nothing can be written under it"),
    ("build-index --out under a file", "build-index --dump {root}/dump --out {root}/good.jsonl/i",
     "{root}/good.jsonl is a file, so nothing can be written under it"),
    ("retrieve --out a directory", "retrieve --questions {root}/q.jsonl --corpus {corpus} --out {corpus}", "a directory is there; this writes a file"),
    ("serve --port 99999", "serve --port 99999", "argument --port: must be a port, 1 to 65535, not 99999"),
    ("serve --max-queue 0", "serve --max-queue 0", "argument --max-queue: must be at least 1, not 0"),
    ("serve --timeout-s -5", "serve --timeout-s -5", "argument --timeout-s: must be above 0, not -5"),
    ("serve --request-timeout-s 0", "serve --request-timeout-s 0", "argument --request-timeout-s: must be above 0, not 0"),
    ("retrieve --k1 nan", "retrieve --questions {root}/q.jsonl --corpus {corpus} --out {tmp}/r.json --k1 nan", "argument --k1: must be a finite number, not nan"),
    ("ask, invalid UTF-8", "ask who\udcff\udcfe", "question is not valid text (it holds a lone surrogate)"),
    ("ask, zero-width characters only", "ask \u200b\u200c\u2060", "question has no visible characters"),
    ("ask --lam nan", "ask who --lam nan", "argument --lam: must be a finite number, not nan"),
    ("ask --memory-threshold inf", "ask who --memory-threshold inf", "argument --memory-threshold: must be a finite number, not inf"),
    ("serve --max-queue-s nan", "serve --max-queue-s nan", "argument --max-queue-s: must be a finite number, not nan"),
    ("serve --timeout-s inf", "serve --timeout-s inf", "argument --timeout-s: must be a finite number, not inf"),
    ("serve, truncated reader weights", "serve --index {index} --model {model} --corpus {corpus} --reader {reader_truncated} --no-prefilter",
     "reader_truncated/model.safetensors: cannot load the weights (SafetensorError"),
    ("read, truncated weights", "read --model {reader_truncated} --input {root}/fid.jsonl --out {tmp}/p.jsonl", "reader_truncated/model.safetensors: cannot load the weights (SafetensorError"),
]


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:      # argparse refuses a flag by exiting
        return e.code


@pytest.mark.parametrize("argv, message", [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_each_bad_input_is_refused_with_one_named_line(kit, tmp_path, capsys, argv, message):
    assert _run(["-q", *argv.format(tmp=tmp_path, **kit).split()]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    message = message.format(tmp=tmp_path, **kit)
    assert last.startswith("odqa") and "error: " in last and message in last, err
    # nothing written, but the home's cache of the checked files' hashes (`remembered_sha256`)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p != tmp_path / "odqa_home" / "hashes.json"]


def test_debug_shows_the_traceback_behind_the_line(kit, tmp_path, capsys, monkeypatch):
    argv = ["read", "--model", str(kit["reader_truncated"]), "--input", str(kit["root"] / "fid.jsonl"),
            "--out", str(tmp_path / "p.jsonl")]
    assert main(["-q", "--debug", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "SafetensorError" in err and err.strip().splitlines()[-1].startswith("odqa: error:")
    monkeypatch.setenv("ODQA_DEBUG", "1")
    assert main(["-q", *argv]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_an_internal_error_is_not_dressed_as_bad_input(monkeypatch):
    from odqa.retriever import index_build
    monkeypatch.setattr(index_build, "build_index", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        main(["-q", "build-index", "--dump", "x", "--out", "y"])


def test_a_folder_that_refuses_the_output_is_named(kit, tmp_path, capsys, monkeypatch):
    """The machine refusing an output mid-run (a folder made read-only, a full disk): one line naming the
    path, and no temporary left behind."""
    import odqa.common.io as io_module

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied", str(dst))
    monkeypatch.setattr(io_module.os, "replace", refuse)
    out = tmp_path / "m.json"
    assert main(["-q", "eval-retrieval", str(kit["root"] / "run.json"), "--no-answerable", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"odqa: error: {out}: Permission denied"
    assert list(tmp_path.iterdir()) == []


def test_an_output_that_is_a_link_is_written_where_it_points(kit, tmp_path):
    """The link stays a link and its target holds the new output (once the link was replaced by a file
    and the target kept the old content): retrieve's results and eval-retrieval's metrics."""
    for name, argv in (("r.json", ["retrieve", "--questions", str(kit["root"] / "q.jsonl"), "--corpus", str(kit["corpus"]),
                                   "--k", "3", "--out"]),
                       ("m.json", ["eval-retrieval", str(kit["root"] / "run.json"), "--no-answerable", "--json"])):
        target, link = tmp_path / "shared" / name, tmp_path / f"link-{name}"
        target.parent.mkdir(exist_ok=True)
        target.write_text("old")
        link.symlink_to(target)
        assert main(["-q", *argv, str(link)]) == 0
        assert link.is_symlink() and link.resolve() == target and json.loads(target.read_text())


@pytest.mark.parametrize("command", ["retrieve", "read"])
def test_two_runs_into_one_output_both_finish_and_leave_one_whole_output(kit, tmp_path, command):
    """`odqa retrieve` or `odqa read` started twice into one --out (once, one died with FileNotFoundError
    on the other's parts): both finish, the output is one run's whole output, no temporary is left."""
    import subprocess
    import sys
    many = tmp_path / "in"
    many.mkdir()
    if command == "retrieve":
        write_jsonl(many / "q.jsonl", [{**q, "id": f"{i}-{q['id']}"} for i in range(40) for q in TINY_QUESTIONS])
        argv = ["retrieve", "--questions", str(many / "q.jsonl"), "--corpus", str(kit["corpus"]), "--k", "3",
                "--batch-size", "1"]
    else:
        rows = [json.loads(line) for line in (kit["root"] / "fid.jsonl").read_text().splitlines()]
        write_jsonl(many / "fid.jsonl", [{**r, "id": f"{i}-{r['id']}"} for i in range(30) for r in rows])
        argv = ["read", "--model", str(kit["reader"]), "--input", str(many / "fid.jsonl"), "--batch-size", "1",
                "--k", "2", "--max-new-tokens", "2"]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / ("r.json" if command == "retrieve" else "p.jsonl")
    runs = [subprocess.Popen([sys.executable, "-m", "odqa.system.cli", "-q", *argv, "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err
    assert not [p for p in out_dir.iterdir() if p.name.startswith(".")]     # no parts, lock or temporary
    if command == "retrieve":
        assert len(json.loads(out.read_text())) == 40 * len(TINY_QUESTIONS)
    else:
        assert len(out.read_text().splitlines()) == 30 * len(rows)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes in a read-only folder")
def test_a_read_only_folder_is_refused_before_the_run(kit, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    assert _run(["-q", "eval-retrieval", str(kit["root"] / "run.json"), "--json", str(locked / "m.json")]) == 2
    assert f"cannot write in {locked} (permission denied)" in capsys.readouterr().err


def test_a_refused_corpus_leaves_the_built_one_as_it_was(kit, tmp_path, capsys):
    out = tmp_path / "c"
    build_corpus([kit["root"] / "good.jsonl"], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for bad in ("latin1.jsonl", "surrogate.jsonl", "gzip.jsonl"):
        assert main(["-q", "corpus", "build", "--input", str(kit["root"] / bad), "--out", str(out)]) == 2
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_corpus_of_empty_texts_is_refused(tmp_path, capsys):
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"id": "a", "title": "A", "text": "  "},
                                                   {"id": "b", "title": "B", "text": ""}])
    assert main(["-q", "corpus", "build", "--input", str(empty), "--out", str(tmp_path / "c")]) == 2
    assert "no passage text in 2 documents" in capsys.readouterr().err
    assert not (tmp_path / "c" / "passages.jsonl").exists()


def test_a_refused_dump_leaves_its_directory_usable(kit, tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["-q", "dump-phrases", "--model", str(kit["model_bad_heads"]), "--corpus", str(kit["corpus"]),
                 "--out", str(out)]) == 2
    assert main(["-q", "dump-phrases", "--model", str(kit["model"]), "--corpus", str(kit["corpus"]),
                 "--out", str(out)]) == 0


# --- checksummed indexes ---------------------------------------------------------------------

def _flip_bytes(path: Path, at: int, n: int = 8) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + n] = bytes(b ^ 0xFF for b in data[at:at + n])
    path.write_bytes(bytes(data))


def test_an_index_corrupted_in_place_is_refused_and_verify_names_the_file(kit, tmp_path, capsys):
    assert main(["-q", "verify", str(kit["index"])]) == 0
    out = capsys.readouterr().out
    assert "start.faiss" in out and "every file matches manifest.json (3 checked)" in out
    broken = tmp_path / "index"
    shutil.copytree(kit["index"], broken)
    _flip_bytes(broken / "start.faiss", (broken / "start.faiss").stat().st_size - 64)   # same size, other bytes
    with pytest.raises(InputError, match="corrupt phrase index: .*start.faiss: its sha256 differs"):
        PhraseIndex(broken)
    assert main(["-q", "verify", str(broken)]) == 2
    assert "start.faiss: its sha256 differs" in capsys.readouterr().err
    assert main(["-q", "verify", str(tmp_path)]) == 2
    assert "index manifest not found" in capsys.readouterr().err      # neither an index nor a checkpoint


def test_nan_scores_are_refused(kit, tmp_path):
    """An index of version 2 without checksums (built before they were recorded) whose vectors hold NaN:
    search refuses."""
    broken = tmp_path / "index"
    shutil.copytree(kit["index"], broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    del manifest["files"]
    manifest["version"] = 2
    (broken / "manifest.json").write_text(json.dumps(manifest))
    start = faiss.read_index(str(broken / "start.faiss"))      # Flat: its vectors, in place
    faiss.rev_swig_ptr(faiss.downcast_index(start).get_xb(), start.ntotal * start.d)[:] = np.nan
    faiss.write_index(start, str(broken / "start.faiss"))
    searcher = Searcher.open(broken, kit["model"], kit["corpus"])
    with pytest.raises(InputError, match="NaN phrase scores, the index is corrupted"):
        searcher.search([TINY_QUESTIONS[0]["question"]], k=3)


# --- every input reader, fed random bytes and random JSON ----------------------------------------

READERS = {
    "corpus": lambda path, out: build_corpus([path], out),
    "questions": lambda path, out: load_questions(path),
    "retrieval file": lambda path, out: evaluate_results(read_results(path), ks=[1, 5]),
    "FiD file": lambda path, out: load_fid_file(path),
}
CTX = {"id": "p1", "title": "Paris", "text": "Paris is in France", "score": 1.5, "has_answer": True}
VALID = {   # a well-formed record of each input, which the mutations below break one field at a time
    "passage": {"id": "p1", "title": "Paris", "text": "Paris is the capital of France ."},
    "document": {"id": "d1", "title": "Paris", "abstract": "A city.",
                 "sections": [{"title": "History", "paragraphs": ["Founded long ago ."], "sections": []}]},
    "question": {"id": "q1", "question": "where is paris", "answers": ["France"], "regex": False},
    "entry": {"id": "q1", "question": "where is paris", "answers": ["France"], "ctxs": [CTX, dict(CTX, id="p2")]},
    "supervision": {"id": "q1", "question": "where is paris", "answers": ["France"], "passage_id": "p1",
                    "title": "Paris", "text": "Paris is the capital of France .", "answer_char_spans": [[24, 30]]},
}
scalars = st.none() | st.booleans() | st.integers() | st.floats() | \
    st.text(string.printable + "é\u2028\ud800\x00", max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) |
                      st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@st.composite
def mutated(draw, obj):
    """`obj` with a few of its values (at any depth) replaced by random JSON, or their keys dropped."""
    if isinstance(obj, (dict, list)) and obj and draw(st.integers(0, 3)):
        obj = dict(obj) if isinstance(obj, dict) else list(obj)
        key = draw(st.sampled_from(sorted(obj) if isinstance(obj, dict) else range(len(obj))))
        action = draw(st.sampled_from(["recurse", "replace", "drop"]))
        if action == "drop":
            del obj[key]
        else:
            obj[key] = draw(mutated(obj[key])) if action == "recurse" else draw(values)
        return obj
    return obj if draw(st.booleans()) else draw(values)


def as_jsonl(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8", "surrogatepass")


def as_json(records):
    return json.dumps(records, ensure_ascii=False).encode("utf-8", "surrogatepass")


def as_dpr_tsv(records):
    """DPR's question TSV of the records: whatever their fields hold, as text and as a literal."""
    out = io.StringIO(newline="")
    csv.writer(out, delimiter="\t", lineterminator="\n").writerows(
        (str(r.get("question", "")), repr(r.get("answers"))) if isinstance(r, dict) else (repr(r),) for r in records)
    return out.getvalue().encode("utf-8", "surrogatepass")


def records(kind):
    return st.lists(mutated(VALID[kind]), min_size=1, max_size=3)


CONTENTS = {   # per reader: random bytes, random JSON lines, and its own records mutated
    "corpus": records("passage").map(as_jsonl) | records("document").map(as_jsonl),
    "questions": records("question").map(as_jsonl) | records("question").map(as_dpr_tsv),
    "retrieval file": records("entry").map(as_json),
    "FiD file": records("entry").map(as_json) | records("entry").map(as_jsonl) | records("supervision").map(as_jsonl),
}
noise = st.binary(max_size=200) | st.lists(values.map(json.dumps), max_size=3).map("\n".join).map(
    lambda s: s.encode("utf-8", "surrogatepass"))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), reader=st.sampled_from(sorted(READERS)), suffix=st.sampled_from([".jsonl", ".json", ".tsv", ".csv", ".parquet"]))
def test_random_input_gives_a_named_error_or_a_result(data, reader, suffix):
    content = data.draw(CONTENTS[reader] | noise)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"input{suffix if reader in ('corpus', 'questions') else '.jsonl'}"
        path.write_bytes(content)
        try:
            READERS[reader](path, Path(tmp) / "out")
            event(f"{reader}: read")
        except InputError as e:
            assert str(e)
            event(f"{reader}: refused")


def test_a_byte_order_mark_is_accepted_and_stripped(tmp_path):
    """Windows editors start UTF-8 files with a BOM; it once made a DPR question file's first line read as
    "1 tab-separated fields"."""
    bom = b"\xef\xbb\xbf"
    (tmp_path / "q.qa.csv").write_bytes(bom + "who wrote hamlet\t['Shakespeare']\n".encode())
    (tmp_path / "q.jsonl").write_bytes(bom + b'{"question": "who wrote hamlet", "answers": ["Shakespeare"]}\n')
    for name in ("q.qa.csv", "q.jsonl"):
        [q] = load_questions(tmp_path / name)
        assert (q.question, q.answers) == ("who wrote hamlet", ["Shakespeare"])
    (tmp_path / "p.jsonl").write_bytes(bom + b'{"id": "a", "title": "t", "text": "hello world"}\n')
    assert build_corpus([tmp_path / "p.jsonl"], tmp_path / "c")["passages"] == 1


def test_read_leaves_questions_without_answers_out_of_em_and_says_so(kit, tmp_path, capsys):
    rows = code_world(3, 2, 0)
    write_jsonl(tmp_path / "fid.jsonl", [rows[0], rows[1], {**rows[2], "answers": []}])
    assert main(["-q", "read", "--model", str(kit["reader"]), "--input", str(tmp_path / "fid.jsonl"),
                 "--out", str(tmp_path / "p.jsonl")]) == 0
    out = capsys.readouterr().out
    assert " on 2 questions; 1 without answers, left out of EM" in out
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 3      # each still gets its prediction


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_float_setting_refuses_nan_and_inf_in_python_too(bad):
    from odqa.reader.args import ReaderSettings
    from odqa.retriever.args import BM25Params
    from odqa.retriever.search_config import MemoryConfig, PrefilterConfig
    from odqa.system.args import ServeConfig
    for cls, name in ((PrefilterConfig, "lam"), (MemoryConfig, "memory_threshold"), (BM25Params, "k1"),
                      (ServeConfig, "timeout_s"), (ServeConfig, "max_queue_s")):
        with pytest.raises(InputError, match="must be a finite number"):
            cls(**{name: bad})
    with pytest.raises(InputError, match="must be a whole number, not '5'"):
        ReaderSettings(batch_size="5")   # once a TypeError from the range check's comparison


@pytest.mark.parametrize("record", [{"lambda": float("nan")}, {"lambda": "0.5"}, [0.5], 3, {"lambda": 0.5, "bm25_weight": float("inf")}])
def test_a_damaged_lambda_table_is_refused_by_name(tmp_path, record):
    from odqa.retriever.doc_index import DocRetriever
    (tmp_path / "lambda.json").write_text(json.dumps(record))   # json writes NaN and Infinity, as a hand edit may
    index = DocRetriever.__new__(DocRetriever)   # the table alone: no model or corpus is read for it
    index.dir = tmp_path
    with pytest.raises(InputError, match="lambda.json: '(lambda|bm25_weight)' must be a finite number"):
        index.tuned_lambda, index.tuned_bm25_weight
