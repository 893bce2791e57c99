"""Checks that both FiD readers' tests run the same way."""
import pytest

from odqa.reader import fid_train
from odqa.reader.fid_train import train_reader


def assert_an_interrupted_training_resumes_with_the_same_losses(loop_args, tmp_path, monkeypatch) -> None:
    """`loop_args(out)` -> (ReaderArgs, LoopArgs) of an 8-step run that checkpoints at step 3 and
    evaluates at step 5, where the interrupted run is stopped."""
    straight = train_reader(*loop_args(tmp_path / "straight"))
    real = fid_train.generate_answers

    def interrupt(*a, **k):
        raise KeyboardInterrupt("interrupted at the step-5 evaluation, after the step-3 checkpoint")

    monkeypatch.setattr(fid_train, "generate_answers", interrupt)
    with pytest.raises(KeyboardInterrupt):
        train_reader(*loop_args(tmp_path / "resumed"))
    monkeypatch.setattr(fid_train, "generate_answers", real)
    reader, loop = loop_args(tmp_path / "resumed")
    loop.resume = True
    again = train_reader(reader, loop)
    assert [h["step"] for h in again["history"]] == list(range(1, 9))
    assert [h["loss"] for h in again["history"]] == pytest.approx([h["loss"] for h in straight["history"]], rel=1e-5)
