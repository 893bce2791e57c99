"""Reader checkpoints in their published layouts load whole, or not at all: facebookresearch/FiD's
readers (saved after `wrap_encoder`, keys `encoder.encoder.block.N.module.*`, one pytorch_model.bin, no
tokenizer) give the logits of the same weights saved as a plain T5, and a checkpoint with a weight
missing, unexpected or of another shape is refused with the weights named, never initialised at random."""
import json
import re

import pytest
import torch
from tiny_data import TINY_DOCS, TINY_QUESTIONS
from tiny_models import make_tiny_t5

from odqa.common.io import InputError
from odqa.reader.read import load_reader

TEXTS = [p for d in TINY_DOCS for s in d["sections"] for p in s["paragraphs"]] * 4 + [q["question"] for q in TINY_QUESTIONS]


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    return make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5", TEXTS, vocab_size=300)


def test_a_load_hides_transformers_bar_for_itself_only(t5, capsys):
    """transformers draws a "Loading weights" bar for every checkpoint, over in milliseconds (six above a
    one-line answer); a load hides it and its report, and leaves the caller's own hook and verbosity."""
    from transformers.utils import logging as hf_logging
    def mine(factory, args, kwargs):
        return factory(*args, **kwargs)
    previous, verbosity = hf_logging.set_tqdm_hook(mine), hf_logging.get_verbosity()
    try:
        load_reader(t5)
        assert "Loading weights" not in capsys.readouterr().err
        assert hf_logging.set_tqdm_hook(mine) is mine and hf_logging.get_verbosity() == verbosity
    finally:
        hf_logging.set_tqdm_hook(previous)


def fid_layout(plain, out):
    """The same weights as FiD's own `save_pretrained` wrote them (transformers 3: every key, tied ones too,
    under EncoderWrapper's and CheckpointWrapper's names)."""
    model, _ = load_reader(plain)
    out.mkdir()
    state = {}
    for key, value in model.state_dict().items():
        key = re.sub(r"^encoder\.", "encoder.encoder.", key)
        key = re.sub(r"^encoder\.encoder\.block\.(\d+)\.", r"encoder.encoder.block.\1.module.", key)
        state[key] = value.clone()
    assert "encoder.encoder.block.0.module.layer.0.SelfAttention.q.weight" in state
    torch.save(state, out / "pytorch_model.bin")
    config = json.loads((plain / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "architectures": ["FiDT5"]}))
    return out


def logits(model, tokenizer):
    ids = tokenizer(["question: where was alice born context: paris", "question: q context: rome"],
                    padding="max_length", max_length=12, truncation=True, return_tensors="pt")
    batch = {"input_ids": ids.input_ids.view(1, 2, 12), "attention_mask": ids.attention_mask.view(1, 2, 12)}
    with torch.no_grad():
        return model(**batch, decoder_input_ids=torch.tensor([[0, 5, 7]])).logits


def test_a_fid_checkpoint_gives_the_plain_t5s_logits(t5, tmp_path):
    fid = fid_layout(t5, tmp_path / "fid")
    with pytest.raises(InputError, match="holds no tokenizer: pass --tokenizer"):
        load_reader(fid)            # FiD ships none, and this width is no published T5's
    plain_model, tokenizer = load_reader(t5)
    fid_model, fid_tokenizer = load_reader(fid, tokenizer_path=t5)
    assert torch.equal(logits(fid_model, fid_tokenizer), logits(plain_model, tokenizer))
    # the FiD layout's width names the T5 whose tokenizer it was made with
    from odqa.reader.checkpoints import tokenizer_source
    assert tokenizer_source(str(fid), type("C", (), {"model_type": "t5", "d_model": 768})(), None) == "t5-base"


def test_odqa_read_takes_a_fid_checkpoint_and_its_tokenizer(t5, tmp_path):
    from odqa.system.cli import main
    fid = fid_layout(t5, tmp_path / "fid")
    entries = [{"id": "1", "question": "where was alice born", "answers": ["paris"],
                "ctxs": [{"id": "a", "title": "alice", "text": "alice was born in paris", "has_answer": True}]}]
    (tmp_path / "r.json").write_text(json.dumps(entries))
    for model, out in ((t5, "plain.jsonl"), (fid, "fid.jsonl")):
        assert main(["read", "--model", str(model), "--tokenizer", str(t5), "--input", str(tmp_path / "r.json"),
                     "--k", "1", "--out", str(tmp_path / out)]) == 0
    assert (tmp_path / "fid.jsonl").read_text() == (tmp_path / "plain.jsonl").read_text()


@pytest.mark.parametrize("damage, named", [
    (lambda s: s.pop("decoder.block.1.layer.2.DenseReluDense.wo.weight"), "missing 1 (decoder.block.1.layer.2.DenseReluDense.wo.weight)"),
    (lambda s: s.update({"encoder.extra.weight": torch.zeros(2)}), "unexpected 1 (encoder.extra.weight)"),
    (lambda s: s.update({"decoder.final_layer_norm.weight": torch.zeros(3)}), "of another shape 1 (decoder.final_layer_norm.weight)"),
])
def test_a_checkpoint_with_a_weight_missing_unexpected_or_misshapen_is_refused_by_name(t5, tmp_path, damage, named):
    import shutil

    from safetensors.torch import load_file, save_file
    bad = tmp_path / "bad"
    shutil.copytree(t5, bad)
    state = load_file(str(bad / "model.safetensors"))
    damage(state)
    save_file(state, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=re.escape(named)):
        load_reader(bad)


def test_a_directory_without_a_tokenizer_is_refused_not_read_with_an_empty_one(t5, tmp_path):
    """transformers makes a tokenizer of a config alone (T5's: 104 tokens, every word unknown); a reader
    read with it answers garbage without a word."""
    import shutil
    bare = tmp_path / "bare"
    shutil.copytree(t5, bare, ignore=shutil.ignore_patterns("tokenizer*", "spiece.model", "special_tokens_map.json"))
    with pytest.raises(InputError, match="bare holds no tokenizer: pass --tokenizer DIR"):
        load_reader(bare)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="--tokenizer .*empty: no tokenizer files there"):
        load_reader(bare, tokenizer_path=tmp_path / "empty")
    assert load_reader(bare, tokenizer_path=t5)[1].get_vocab() == load_reader(t5)[1].get_vocab()
