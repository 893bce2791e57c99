"""Every checkpoint odqa writes is sealed with the sha256 of each of its files (checksums.json), and a
damaged one is refused by name wherever it is loaded (`ask`, `verify`), never searched or read with
its damage: one flipped byte of a reader's weights once answered "Brody" for "Roy Scheider", exit 0."""
import json
import shutil
from pathlib import Path

import pytest
from tiny_data import TINY_DOCS, TINY_QUESTIONS
from tiny_models import make_tiny_system

from odqa.common.weights import CHECKSUMS
from odqa.system.cli import main


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("sealed")
    world = make_tiny_system(root)
    from odqa.reader.args import ReaderInitArgs
    from odqa.reader.t5_init import init_reader
    texts = [p for d in TINY_DOCS for s in d["sections"] for p in s["paragraphs"]] * 4
    init_reader(texts, root / "reader", ReaderInitArgs(shape="tiny", vocab_size=300))    # `odqa reader init`: sealed
    return {**world, "reader": root / "reader"}


def flipped(src, dst, name):
    """A copy of checkpoint `src` at `dst` with one byte of its file `name` flipped (its size unchanged)."""
    shutil.copytree(src, dst)
    _flip(dst / name)
    return dst


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def ask(world, phrase, reader, *extra):
    return main(["ask", TINY_QUESTIONS[0]["question"], "--model", str(phrase), "--index", str(world["index"]),
                 "--corpus", str(world["corpus"]), "--reader", str(reader), "--no-prefilter", "--no-reranker",
                 "--no-memory", "--k", "2", *extra])


def test_what_odqa_writes_is_sealed_and_verifies(world, capsys):
    for path in (world["phrase"], world["reader"]):
        recorded = json.loads((path / CHECKSUMS).read_text())
        assert any(name.endswith((".safetensors", ".pt")) for name in recorded)
        assert main(["verify", str(path)]) == 0
        assert f"every file matches {CHECKSUMS}" in capsys.readouterr().out
    assert ask(world, world["phrase"], world["reader"]) == 0


@pytest.mark.parametrize("part, name", [("phrase", "phrase_lm/model.safetensors"), ("phrase", "q_start_lm/model.safetensors"),
                                        ("phrase", "question_heads.pt"), ("reader", "model.safetensors")])
def test_a_flipped_byte_in_any_weight_file_is_refused_by_ask_and_verify(world, tmp_path, capsys, part, name):
    damaged = flipped(world[part], tmp_path / part, name)
    parts = {"phrase": world["phrase"], "reader": world["reader"], part: damaged}
    assert ask(world, parts["phrase"], parts["reader"]) == 2
    err = capsys.readouterr().err
    assert f"damaged {'phrase model' if part == 'phrase' else 'reader'}: {damaged / name}: its sha256 differs" in err
    assert "Traceback" not in err
    assert main(["verify", str(damaged)]) == 2
    assert f"{damaged / name}: its sha256 differs" in capsys.readouterr().err


def test_a_large_file_is_hashed_once_refused_when_damaged_and_hashed_anew_by_verify(world, tmp_path, capsys, monkeypatch):
    """Weights over VERIFY_ON_OPEN_BYTES (lowered here; a published t5-base reader is some 900 MB) once had
    only their size checked on loading: a flipped byte answered, exit 0. Now they are hashed, once: the hash
    is remembered by size, inode and times, so the next load does not hash them again, and a write since
    is seen."""
    import odqa.common.io as io_module
    monkeypatch.setattr(io_module, "VERIFY_ON_OPEN_BYTES", 1024)   # its weights count as large
    hashed = []
    real = io_module.file_sha256
    monkeypatch.setattr(io_module, "file_sha256", lambda path: hashed.append(Path(path)) or real(path))
    good = tmp_path / "good"
    shutil.copytree(world["reader"], good)
    weights = (good / "model.safetensors").resolve()
    assert ask(world, world["phrase"], good) == 0 and hashed.count(weights) == 1
    assert ask(world, world["phrase"], good) == 0 and hashed.count(weights) == 1   # remembered
    _flip(good / "model.safetensors")
    assert ask(world, world["phrase"], good) == 2
    assert f"damaged reader: {good / 'model.safetensors'}: its sha256 differs" in capsys.readouterr().err
    damaged = flipped(world["reader"], tmp_path / "reader", "model.safetensors")
    assert ask(world, world["phrase"], damaged) == 2
    assert "its sha256 differs" in capsys.readouterr().err
    assert main(["verify", str(damaged)]) == 2
    assert "its sha256 differs" in capsys.readouterr().err
    (damaged / "model.safetensors").write_bytes((damaged / "model.safetensors").read_bytes()[:-1])
    assert ask(world, world["phrase"], damaged) == 2
    assert f"bytes, {CHECKSUMS} says" in capsys.readouterr().err


def test_a_checkpoint_odqa_did_not_write_loads_as_it_is_and_verify_says_so(world, capsys):
    assert not (world["t5"] / CHECKSUMS).exists()        # saved by transformers, as a hub T5 is
    assert ask(world, world["phrase"], world["t5"]) == 0
    capsys.readouterr()
    assert main(["verify", str(world["t5"])]) == 0
    assert f"no {CHECKSUMS}, so nothing to check it against" in capsys.readouterr().out
