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


def assert_held_in_reading_dtype_reads_alike(model_path, examples, k: int, monkeypatch, **settings) -> None:
    """`in_reading_dtype`: every linear layer in bfloat16, the embeddings kept in float32, and the same
    answers, spans and free, as the model autocast casts at each call; a float32 read is refused."""
    import torch

    from odqa.reader.read import in_reading_dtype
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "bfloat16")
    cast, tokenizer = load_reader(model_path)
    held = in_reading_dtype(load_reader(model_path)[0])
    linears = [m for m in held.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(m.weight.dtype == torch.bfloat16 for m in linears)
    assert held.get_input_embeddings().weight.dtype == torch.float32
    for decoding in ("spans", "free"):
        expected = generated(cast, tokenizer, examples, k, decoding=decoding, **settings)
        assert generated(held, tokenizer, examples, k, decoding=decoding, **settings) == expected
    with pytest.raises(ValueError, match="in_reading_dtype"):
        generated(held, tokenizer, examples, k, dtype=torch.float32, **settings)
    monkeypatch.setenv("ODQA_SEARCH_DTYPE", "float32")
    assert in_reading_dtype(cast) is cast and cast.get_output_embeddings().weight.dtype == torch.float32
