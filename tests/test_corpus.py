
import json

import numpy as np
import pytest
from tiny_data import write_jsonl

from odqa.common.corpus import DocumentTable, PassageStore, build_corpus, corpus_info, read_source
from odqa.common.io import InputError, atomic_path, read_jsonl


def load(path):
    return [obj for _, obj in read_jsonl(path)]


def test_structured_documents(tiny_corpus):
    passages = load(tiny_corpus / "passages.jsonl")
    docs = load(tiny_corpus / "documents.jsonl")
    assert [d["id"] for d in docs] == ["paris", "beatles", "roentgen", "everest"]
    paris = [p for p in passages if p["doc_id"] == "paris"]
    # Passages never cross sections: the lead, History, and History/Middle Ages are separate.
    assert [p["section"] for p in paris] == [[], ["History"], ["History", "Middle Ages"]]
    assert paris[0]["text"] == ("Paris is the capital and largest city of France.\n"
                                "The Eiffel Tower was completed in 1889 for the World's Fair.")
    assert docs[0]["toc"] == ["History", "Middle Ages"]                  # pre-order section titles
    assert docs[0]["abstract"] == paris[0]["text"]                       # first passage when none given
    assert docs[1]["abstract"] == "English rock band."                   # the input's abstract wins
    assert [d["n_passages"] for d in docs] == [3, 1, 1, 1]
    assert corpus_info(tiny_corpus)["passages"] == len(passages) == 6
    assert len({p["id"] for p in passages}) == len(passages)


def test_offsets_point_into_the_section_text(tmp_path):
    long_para = " ".join(f"Sentence {i} is here." for i in range(60))  # 240 words
    doc = {"id": "d", "title": "D", "sections": [{"title": "S", "paragraphs": ["Intro line.", long_para]}]}
    out = tmp_path / "c"
    build_corpus([write_jsonl(tmp_path / "d.jsonl", [doc])], out)
    section_text = "Intro line.\n" + long_para
    passages = load(out / "passages.jsonl")
    assert len(passages) == 3
    for p in passages:
        assert section_text[p["char_start"]:p["char_end"]] == p["text"]
        assert len(p["text"].split()) <= 100


def test_dpr_tsv_keeps_ids_and_groups_titles(tmp_path):
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text('id\ttext\ttitle\n1\t"Aaron is a ""prophet""."\tAaron\n2\tHe had a rod.\tAaron\n'
                   '3\tAbba is a band.\tABBA\n', encoding="utf-8")
    out = tmp_path / "c"
    info = build_corpus([tsv], out)
    passages = load(out / "passages.jsonl")
    assert [(p["id"], p["doc_id"]) for p in passages] == [("1", "1"), ("2", "1"), ("3", "3")]
    assert passages[0]["text"] == 'Aaron is a "prophet".'
    assert info["documents"] == 2


@pytest.mark.parametrize("suffix,compress", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_compressed_inputs_build_the_same_corpus(tmp_path, suffix, compress):
    """DPR ships psgs_w100.tsv.gz: a compressed file is read through its decompressor, its format told
    by the name under the compression's suffix, and the corpus is the plain file's, byte for byte."""
    import importlib
    tsv = tmp_path / "psgs.tsv"
    tsv.write_text("id\ttext\ttitle\n1\tAaron is a prophet.\tAaron\n2\tAbba is a band.\tABBA\n", encoding="utf-8")
    packed = tmp_path / f"psgs.tsv{suffix}"
    packed.write_bytes(importlib.import_module(compress).compress(tsv.read_bytes()))
    plain, zipped = build_corpus([tsv], tmp_path / "plain"), build_corpus([packed], tmp_path / "packed")
    assert zipped["fingerprint"] == plain["fingerprint"] and zipped["passages"] == 2
    assert (tmp_path / "packed/passages.jsonl").read_bytes() == (tmp_path / "plain/passages.jsonl").read_bytes()
    truncated = tmp_path / f"cut.tsv{suffix}"
    truncated.write_bytes(packed.read_bytes()[:-8])
    with pytest.raises(InputError, match="cannot decompress|not UTF-8"):
        build_corpus([truncated], tmp_path / "cut")
    assert not (tmp_path / "cut" / "passages.jsonl").exists()


def test_passages_jsonl_and_overlong_passage_is_split(tmp_path):
    rows = [{"id": "p1", "title": "T", "text": "short text."},
            {"id": "p2", "title": "T", "text": " ".join(["word"] * 150)}]
    out = tmp_path / "c"
    build_corpus([write_jsonl(tmp_path / "p.jsonl", rows)], out)
    assert [p["id"] for p in load(out / "passages.jsonl")] == ["p1", "p2-0", "p2-1"]


@pytest.mark.parametrize("content, fmt, message", [
    ('{"id": "a", "title": "A", "sections": []}\n{not json}\n', "documents", ":2: not valid JSON"),
    ('{"id": "a", "title": "A", "sections": []}\n{"id": "b", "sections": []}\n', "documents", ":2: a document needs"),
    ('{"id": "a", "title": "A", "sections": [{"title": "S", "paragraphs": "oops"}]}\n', "documents", ":1: section 'S'"),
    ('{"id": "a", "title": "A", "text": "t"}\n{"id": "b", "title": 3, "text": "t"}\n', "passages", ":2: a passage needs"),
    ("id\ttext\ttitle\n1\tok\tT\n2\tmissing title\n", "dpr-tsv", ":3: expected 3 tab-separated fields"),
    ("pid\ttext\n", "dpr-tsv", ":1: expected the header"),
])
def test_malformed_input_names_file_and_line_and_keeps_old_outputs(tmp_path, tiny_docs, content, fmt, message):
    out = tmp_path / "c"
    build_corpus([tiny_docs], out)
    before = (out / "passages.jsonl").read_text()
    bad = tmp_path / ("bad.tsv" if fmt == "dpr-tsv" else "bad.jsonl")
    bad.write_text(content)
    with pytest.raises(InputError) as e:
        build_corpus([bad], out, fmt=fmt)
    assert str(bad) + message in str(e.value)
    assert (out / "passages.jsonl").read_text() == before           # the old outputs survive
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]       # and no temporary is left


def test_missing_input_and_unbuilt_corpus(tmp_path):
    with pytest.raises(InputError, match="corpus input not found"):
        list(read_source(tmp_path / "nope.jsonl"))
    with pytest.raises(InputError, match="not a built corpus"):
        PassageStore(tmp_path)


def test_passage_store_random_access(tiny_corpus):
    store = PassageStore(tiny_corpus)
    passages = load(tiny_corpus / "passages.jsonl")
    assert len(store) == len(passages)
    assert [store[i] for i in (5, 0, 3)] == [passages[5], passages[0], passages[3]]
    assert list(store) == passages
    assert store.rows_of([passages[4]["id"], "no such passage", passages[1]["id"]]) == \
        {passages[1]["id"]: 1, passages[4]["id"]: 4}
    # The offsets are cached next to the corpus and reused.
    assert list(tiny_corpus.glob("passages.offsets.*.npz"))
    assert PassageStore(tiny_corpus)[2] == passages[2]


def test_a_corpus_file_edited_after_its_build_is_refused_by_name(tiny_corpus, tmp_path):
    """An edit of the same size (a word changed: once an answer cut mid-word, "tten by Wil") or another
    size, in passages.jsonl or documents.jsonl: refused at opening by corpus.json's record of the files."""
    import shutil
    for name, opener in (("passages.jsonl", PassageStore), ("documents.jsonl", DocumentTable)):
        for edit in (lambda t: t.replace("a", "o", 1), lambda t: t.replace("a", "aa", 1)):
            copy = tmp_path / f"c-{name}"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(tiny_corpus, copy)
            opener(copy)
            (copy / name).write_text(edit((copy / name).read_text()))
            with pytest.raises(InputError, match=rf"changed corpus: {copy / name}: .*corpus.json.*rebuilt"):
                opener(copy)


def test_passage_store_reads_an_edited_file_again_and_names_a_bad_line(tiny_corpus, tmp_path):
    """A corpus built before corpus.json recorded its files: an edited passages.jsonl is walked again
    rather than read at stale offsets."""
    import shutil
    copy = tmp_path / "c"
    shutil.copytree(tiny_corpus, copy)
    info = json.loads((copy / "corpus.json").read_text())
    del info["files"]
    (copy / "corpus.json").write_text(json.dumps(info))
    passages = load(copy / "passages.jsonl")
    assert PassageStore(copy)[1] == passages[1]                       # the offsets are cached now
    passages[0]["text"] = "A longer first passage, edited by hand. " + passages[0]["text"]
    lines = [json.dumps(p) for p in passages]
    (copy / "passages.jsonl").write_text("\n".join(lines[:2] + ["", ""] + lines[2:]) + "\n")
    store = PassageStore(copy)                                         # not the stale offsets: every row moved
    assert [store[i] for i in range(len(store))] == passages and list(store) == passages
    (copy / "passages.jsonl").write_text("\n".join(lines[:3] + [lines[3][:-1]] + lines[4:]) + "\n")
    with pytest.raises(InputError, match=r"passages.jsonl, row 3: not valid JSON"):
        PassageStore(copy)[3]


def test_document_table_reads_documents_by_offset_and_names_a_bad_line(tiny_corpus, tmp_path):
    import os
    import pickle
    import shutil
    docs = load(tiny_corpus / "documents.jsonl")
    table = DocumentTable(tiny_corpus)
    assert len(table) == len(docs) and list(table.ids) == [d["id"] for d in docs]
    assert [table.docs[i] for i in (3, 0, -1)] == [docs[3], docs[0], docs[-1]] and table.docs[1:3] == docs[1:3]
    assert list(table.docs) == docs and table.row_of["roentgen"] == 2
    assert list(table.passage_rows(0)) == [0, 1, 2] and table.doc_of_passage.tolist() == [0, 0, 0, 1, 2, 3]
    assert list(tiny_corpus.glob("documents.index.*.npz"))           # cached beside the corpus
    assert DocumentTable(tiny_corpus).docs[2] == docs[2]
    if os.fork() == 0:                                               # a forked reader moves no shared place
        os._exit(0 if [table.docs[i] for i in (2, 1)] == [docs[2], docs[1]] else 1)
    assert [table.docs[i] for i in (0, 3)] == [docs[0], docs[3]] and os.wait()[1] == 0
    sent = pickle.loads(pickle.dumps(table))                         # as to a spawned worker: its own file
    assert sent.docs._fd is None and sent.docs[1] == docs[1] and sent.docs._fd != table.docs._fd
    copy = tmp_path / "c"
    shutil.copytree(tiny_corpus, copy)
    info = json.loads((copy / "corpus.json").read_text())
    del info["files"]   # built before corpus.json recorded its files, which would refuse the edit
    (copy / "corpus.json").write_text(json.dumps(info))
    lines = (copy / "documents.jsonl").read_text().split("\n")
    (copy / "documents.jsonl").write_text("\n".join(lines[:2] + ["", lines[2][:-1]] + lines[3:]))
    with pytest.raises(InputError, match=r"documents.jsonl:4: not valid JSON"):   # the changed file, not the cache
        DocumentTable(copy)


@pytest.mark.parametrize("damage", ["flipped", "truncated", "wrong offsets"])
def test_a_damaged_line_index_is_walked_again_not_trusted(tiny_corpus, tmp_path, damage, caplog):
    """The cached offsets of passages.jsonl and documents.jsonl are derived: a damaged cache (a flipped
    byte, a truncation: once a BadZipFile) or one whose offsets cannot be the file's lines (once a passage
    cut mid-word) is read again from the file, and written sound."""
    import shutil
    copy = tmp_path / "c"
    shutil.copytree(tiny_corpus, copy)
    passages, docs = load(copy / "passages.jsonl"), load(copy / "documents.jsonl")
    PassageStore(copy), DocumentTable(copy)   # the caches are written
    for cache in [*copy.glob("passages.offsets.*.npz"), *copy.glob("documents.index.*.npz")]:
        data = bytearray(cache.read_bytes())
        if damage == "flipped":
            data[len(data) // 3] ^= 0xFF
        elif damage == "truncated":
            data = data[:len(data) // 2]
        else:
            with np.load(cache) as z:
                arrays = {name: z[name] for name in z.files}
            arrays["offsets"] = arrays["offsets"] + 3
            np.savez(cache, **arrays)
            data = cache.read_bytes()
        cache.write_bytes(bytes(data))
    assert [PassageStore(copy)[i] for i in range(len(passages))] == passages
    assert list(DocumentTable(copy).docs) == docs
    assert caplog.text.count("reading") >= 2   # each cache said why it was not used
    caplog.clear()
    assert list(PassageStore(copy)) == passages and list(DocumentTable(copy).docs) == docs
    assert "reading" not in caplog.text          # and was rewritten sound


def test_a_corpus_that_cannot_be_written_to_is_read_without_its_caches(tiny_corpus, tmp_path, monkeypatch):
    import shutil

    from odqa.common import corpus
    copy = tmp_path / "shared"
    shutil.copytree(tiny_corpus, copy)
    for cache in [*copy.glob("*.npy"), *copy.glob("*.npz")]:
        cache.unlink()

    def read_only(path):
        raise PermissionError(f"read-only: {path}")
    monkeypatch.setattr(corpus, "atomic_path", read_only)
    assert DocumentTable(copy).docs[1] == load(copy / "documents.jsonl")[1]
    assert PassageStore(copy)[4] == load(copy / "passages.jsonl")[4]
    assert not list(copy.glob("*.np?"))


def test_atomic_path_replaces_a_directory_and_cleans_up_on_error(tmp_path):
    target = tmp_path / "index"
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "a").write_text("2")
            raise RuntimeError("interrupted")
    assert (target / "a").read_text() == "1"
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "b").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]


def test_temporaries_of_killed_writers_are_removed_by_the_next_write(tmp_path):
    import os
    import subprocess
    import sys

    from odqa.common.io import atomic_path
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()                                                # a pid whose process is gone
    out = tmp_path / "index"
    (tmp_path / f".index.tmp-{dead.pid}").mkdir()              # a killed build-index's half-written directory
    (tmp_path / f".index.old-{dead.pid}").mkdir()
    (tmp_path / f".index.tmp-{os.getppid()}").write_text("a running writer's")   # its process is alive
    (tmp_path / f".index.b.tmp-{dead.pid}").write_text("another file's temporary, not ours to judge")
    with atomic_path(out) as tmp:
        tmp.mkdir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["index", f".index.tmp-{os.getppid()}", f".index.b.tmp-{dead.pid}"])


def test_an_id_given_twice_is_refused_and_the_corpus_there_is_kept(tmp_path, tiny_corpus):
    """Passages and documents are looked up by id: a corpus holding one twice would answer with the wrong
    passage. The built corpus in --out stays as it was."""
    import shutil
    out = tmp_path / "c"
    shutil.copytree(tiny_corpus, out)
    before = (out / "passages.jsonl").read_bytes()
    rows = [{"id": "7", "title": "A", "text": "one passage"}, {"id": "8", "title": "B", "text": "another"},
            {"id": "7", "title": "C", "text": "the first's id again"}]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError, match=r"p.jsonl: the passage id '7' is given more than once"):
        build_corpus([tmp_path / "p.jsonl"], out)
    docs = [{"id": "d", "title": "A", "sections": [{"title": "", "paragraphs": ["x y"]}]},
            {"id": "d", "title": "B", "sections": [{"title": "", "paragraphs": ["z"]}]}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in docs))
    with pytest.raises(InputError, match=r"d.jsonl: the (passage|document) id 'd(#0)?' is given more than once"):
        build_corpus([tmp_path / "d.jsonl"], out)
    assert (out / "passages.jsonl").read_bytes() == before and not [p for p in out.iterdir() if ".tmp-" in p.name]
    rows[2]["id"] = "9"
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert build_corpus([tmp_path / "p.jsonl"], out)["passages"] == 3
