"""Question sets and corpora through HF `datasets`: local JSON, CSV, TSV and Parquet files, plain and
compressed, and hub datasets in the hub's layout (a directory of `data/SPLIT-00000-of-00001.parquet`),
with the field names of nq_open, trivia_qa, KILT, SQuAD, wiki_dpr and pyserini."""
import bz2
import csv
import gzip
import json
import lzma

import pandas as pd
import pytest
from tiny_data import write_jsonl

from odqa.common.corpus import PassageStore, build_corpus
from odqa.common.io import InputError
from odqa.common.questions import load_questions, question_set_name

QUESTIONS = [{"id": "q1", "question": "who wrote hamlet", "answers": ["Shakespeare", "William Shakespeare"]},
             {"id": "q2", "question": "capital of peru", "answers": ["Lima"]}]
PASSAGES = [{"id": "1", "title": "Hamlet", "text": "Hamlet is a tragedy by William Shakespeare."},
            {"id": "2", "title": "Lima", "text": "Lima is the capital of Peru."}]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def csv_text(rows, fields, delimiter=","):
    import io
    out = io.StringIO()
    writer = csv.DictWriter(out, fields, delimiter=delimiter, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})
    return out.getvalue()


def seen(questions):
    return [(q.id, q.question, q.answers) for q in questions]


def write_rows(path, rows, fields=None):
    """`rows` in the format its name says (.json, .jsonl, .csv, .tsv, .parquet), compressed as it says
    (.gz, .bz2, .xz)."""
    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}.get(path.suffix)
    kind = path.with_suffix("").suffix if opener else path.suffix
    if kind == ".parquet":
        pd.DataFrame(rows).to_parquet(path)
        return path
    text = {".json": lambda: json.dumps(rows), ".jsonl": lambda: "".join(json.dumps(r) + "\n" for r in rows),
            ".csv": lambda: csv_text(rows, fields or list(rows[0])),
            ".tsv": lambda: csv_text(rows, fields or list(rows[0]), delimiter="\t")}[kind]()
    with (opener or open)(path, "wt") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("name", ["q.json", "q.jsonl.gz", "q.csv", "q.csv.bz2", "q.tsv.xz", "q.parquet"])
def test_a_question_file_of_each_format_reads_the_same(tmp_path, name):
    path = write_rows(tmp_path / name, QUESTIONS)
    assert seen(load_questions(path)) == seen(load_questions(write_jsonl(tmp_path / "plain.jsonl", QUESTIONS)))
    assert seen(load_questions(f"{path}:1")) == seen(load_questions(path))[:1]


def hub_dir(root, rows, split="validation"):
    """A hub dataset's layout as `datasets` publishes it: data/SPLIT-00000-of-00001.parquet."""
    (root / "data").mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(root / "data" / f"{split}-00000-of-00001.parquet")
    return root


def test_hub_datasets_read_in_each_of_the_fields_layouts(tmp_path):
    expected = [(q["question"], q["answers"]) for q in QUESTIONS]
    nq_open = hub_dir(tmp_path / "nq_open", [{"question": q["question"], "answer": q["answers"]} for q in QUESTIONS])
    trivia = hub_dir(tmp_path / "trivia_qa", [{"question": q["question"], "question_id": q["id"],
                                               "answer": {"aliases": q["answers"], "value": q["answers"][0],
                                                          "normalized_aliases": [a.lower() for a in q["answers"]]}}
                                              for q in QUESTIONS])
    kilt = hub_dir(tmp_path / "kilt_nq", [{"id": q["id"], "input": q["question"],
                                           "output": [{"answer": a, "provenance": []} for a in q["answers"]]}
                                          for q in QUESTIONS])
    squad = hub_dir(tmp_path / "squad", [{"id": q["id"], "question": q["question"], "context": "c",
                                          "answers": {"text": q["answers"], "answer_start": [0] * len(q["answers"])}}
                                         for q in QUESTIONS])
    for path in (nq_open, trivia, kilt, squad):
        questions = load_questions(f"hf:{path}")           # the default split: validation
        assert [(q.question, q.answers) for q in questions] == expected, path
    assert [q.id for q in load_questions(f"hf:{trivia}")] == ["q1", "q2"]
    assert question_set_name(f"hf:{trivia}@validation:1") == "trivia_qa-validation"
    with pytest.raises(InputError, match="could not read it"):
        load_questions(f"hf:{nq_open}@test")                 # no such split
    with pytest.raises(InputError, match="could not read it"):
        load_questions("hf:no-such-dataset-here")            # the hub is out of reach here


def test_a_row_without_a_question_or_answers_is_refused_by_name(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps([{"query_text": "x", "answers": ["a"]}]))
    with pytest.raises(InputError, match=r"q.json:1: no question field"):
        load_questions(path)
    path.write_text(json.dumps([{"question": "x", "answers": 5}]))
    with pytest.raises(InputError, match=r"q.json:1: no answers"):
        load_questions(path)


def test_a_dpr_qa_csv_is_still_read_as_dprs(tmp_path):
    path = tmp_path / "nq-test.qa.csv"
    path.write_text("who wrote hamlet\t['Shakespeare', 'William Shakespeare']\n")
    assert load_questions(path)[0].answers == ["Shakespeare", "William Shakespeare"]


@pytest.mark.parametrize("name", ["p.json", "p.csv.gz", "p.tsv", "p.parquet", "hub"])
def test_a_corpus_of_each_format_builds_the_same_passages(tmp_path, name):
    if name == "p.tsv":   # pyserini's field names
        path = write_rows(tmp_path / name, [{"docid": p["id"], "title": p["title"], "contents": p["text"]}
                                            for p in PASSAGES])
    elif name == "hub":   # wiki_dpr's fields, vectors and all
        path = f"hf:{hub_dir(tmp_path / 'wiki_dpr', [{**p, 'embeddings': [0.5] * 4} for p in PASSAGES], 'train')}"
    else:
        path = write_rows(tmp_path / name, PASSAGES)
    build_corpus([path], tmp_path / "corpus")
    build_corpus([write_jsonl(tmp_path / "plain.jsonl", PASSAGES)], tmp_path / "plain")
    got = [(p["id"], p["title"], p["text"]) for p in PassageStore(tmp_path / "corpus")]
    assert got == [(p["id"], p["title"], p["text"]) for p in PassageStore(tmp_path / "plain")]


def test_dprs_tsv_keeps_its_own_reader_and_a_bad_passage_row_is_named(tmp_path):
    dpr = tmp_path / "psgs.tsv"
    dpr.write_text("id\ttext\ttitle\n1\tsome text\tT\n")
    assert build_corpus([dpr], tmp_path / "c1")["passages"] == 1
    bad = tmp_path / "p.parquet"
    pd.DataFrame([{"id": "1", "body": "x"}]).to_parquet(bad)
    with pytest.raises(InputError, match=r"p.parquet:1: a passage needs"):
        build_corpus([bad], tmp_path / "c2")
