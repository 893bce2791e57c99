"""Checks that both FiD readers' tests run the same way, and reading as the tests do it."""
import pytest

from odqa.reader import fid_train
from odqa.reader.args import ReaderSettings
from odqa.reader.fid_train import train_reader
from odqa.reader.read import generate, load_reader, read


def generated(model, tokenizer, examples, k: int, device="cpu", **settings) -> list[str]:
    """The reader's answers from each example's top k passages, read by `ReaderSettings` with
    `settings` (and `generate`'s own keywords: refuse_echoes, dtype, progress)."""
    own = {name: settings.pop(name) for name in ("refuse_echoes", "dtype", "progress") if name in settings}
    return generate(model, tokenizer, examples, [k], ReaderSettings(**settings), device, **own)[k]


def read_file(model_path, fid_file, out, k: int = 10, limit=None, **settings) -> dict:
    """`odqa read` of a retrieval file at k: its summary."""
    model, tokenizer = load_reader(model_path)
    return read(model, tokenizer, fid_file, {k: out}, ReaderSettings(**settings), limit=limit)[k]


def assert_an_interrupted_training_resumes_with_the_same_losses(loop_args, tmp_path, monkeypatch) -> None:
    """`loop_args(out)` -> (ReaderArgs, LoopArgs) of an 8-step run that checkpoints at step 3 and
    evaluates at step 5, where the interrupted run is stopped."""
    straight = train_reader(*loop_args(tmp_path / "straight"))
    real = fid_train.generate

    def interrupt(*a, **k):
        raise KeyboardInterrupt("interrupted at the step-5 evaluation, after the step-3 checkpoint")

    monkeypatch.setattr(fid_train, "generate", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train_reader(*loop_args(tmp_path / "resumed"))
    monkeypatch.setattr(fid_train, "generate", real)
    reader, loop = loop_args(tmp_path / "resumed")
    loop.resume = True
    again = train_reader(reader, loop)
    assert [h["step"] for h in again["history"]] == list(range(1, 9))
    assert [h["loss"] for h in again["history"]] == pytest.approx([h["loss"] for h in straight["history"]], rel=1e-5)
