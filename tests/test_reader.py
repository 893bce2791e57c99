"""The FiD reader on a tiny T5 made in the test: FiD at k = 1 is T5; generate(); checkpoint round trip;
the tokenizer; a synthetic task learnt through DeepSpeed; resume; two processes = one with twice the
accumulation; refusals of bad checkpoints and bad input."""
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from loop_checks import assert_reported
from reader_checks import (
    assert_an_interrupted_training_resumes_with_the_same_losses,
    assert_held_in_reading_dtype_reads_alike,
    read_file,
)
from tiny_data import CODE_NAMES as NAMES
from tiny_data import HOBBIES, TINY_DOCS, code_world, write_jsonl
from tiny_models import make_tiny_t5
from transformers import AutoTokenizer, T5ForConditionalGeneration

from odqa.common.corpus import build_corpus
from odqa.common.io import InputError
from odqa.common.settings import from_flat
from odqa.common.trainer import deepspeed_config
from odqa.reader.args import LoopArgs
from odqa.reader.cloze import salient_spans
from odqa.reader.fid import FiDT5
from odqa.reader.fid_data import FiDCollator, FiDExample, load_fid_file
from odqa.reader.fid_train import ReaderArgs, split_examples, train_reader
from odqa.reader.pretrain import span_corrupt
from odqa.reader.read import load_reader


@pytest.fixture(scope="module")
def t5(tmp_path_factory) -> Path:
    texts = [f"the code of {n} is {d} ." for n in NAMES for d in range(10)] + \
            [f"question: what is the code of {n} ? title: people context: {n} likes {h} ." for n in NAMES for h in HOBBIES]
    return make_tiny_t5(tmp_path_factory.mktemp("t5") / "t5", texts, vocab_size=300, d_model=64)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fid_data")
    (root / "train.json").write_text(json.dumps(code_world(800, 4, 0)))
    (root / "val.json").write_text(json.dumps(code_world(100, 4, 1)))
    return root


def test_tokenizer_round_trip_and_sentinels(t5):
    tok = AutoTokenizer.from_pretrained(t5)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    assert tok.convert_tokens_to_ids("<extra_id_0>") == len(tok) - 1
    assert tok.convert_tokens_to_ids("<extra_id_99>") == len(tok) - 100
    text = "what is the code of erin ? 7"
    ids = tok(text).input_ids
    assert ids[-1] == tok.eos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    # Characters the training texts never show still get pieces of their own, not <unk>.
    rare = "Who won?! [Zoë's] #1 @ $5 ~ 100% & more; {x|y} ^_^"
    assert tok.unk_token_id not in tok(rare.replace("ë", "e")).input_ids


def test_fid_with_one_passage_is_t5(t5):
    fid = FiDT5.from_pretrained(t5).eval()
    plain = T5ForConditionalGeneration.from_pretrained(t5).eval()
    ids = torch.randint(3, 100, (2, 1, 9))
    mask = torch.ones_like(ids)
    mask[1, 0, 6:] = 0
    labels = torch.randint(3, 100, (2, 4))
    a = fid(input_ids=ids, attention_mask=mask, labels=labels).logits
    b = plain(input_ids=ids[:, 0], attention_mask=mask[:, 0], labels=labels).logits
    assert torch.allclose(a, b, atol=1e-6)


def test_a_frozen_t5_bottom_holds_the_shared_embedding_and_first_blocks(t5):
    fid = FiDT5.from_pretrained(t5)
    fid.freeze_encoder_bottom(embeddings=True, layers=1)
    assert not fid.shared.weight.requires_grad
    assert fid.lm_head.weight.requires_grad != fid.config.tie_word_embeddings     # tied, it is the same tensor
    assert not any(p.requires_grad for p in fid.encoder.block[0].parameters())
    assert all(p.requires_grad for p in fid.encoder.block[1].parameters())
    assert all(p.requires_grad for p in fid.decoder.block.parameters())


def test_generate_matches_step_by_step_greedy_and_masks_padding(t5):
    fid = FiDT5.from_pretrained(t5).eval()
    ids = torch.randint(3, 100, (2, 3, 7))
    mask = torch.ones_like(ids)
    mask[1, 2] = 0                       # an empty (padded) passage
    out = fid.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    dec = torch.zeros(2, 1, dtype=torch.long)
    for _ in range(out.shape[1] - 1):
        logits = fid(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits[:, -1]
        dec = torch.cat([dec, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, dec)
    beams = fid.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, num_beams=3)
    assert beams.shape[0] == 2
    # What a masked passage holds cannot change the answer.
    ids2 = ids.clone()
    ids2[1, 2] = torch.randint(3, 100, (7,))
    assert torch.equal(fid.generate(input_ids=ids2, attention_mask=mask, max_new_tokens=5), out)


def test_t5_passages_encoded_in_length_groups_read_as_one_padded_call(t5):
    """FusedEncoder's buckets under T5's relative positions: the same states on real tokens, the same
    logits and answers as one padded call."""
    fid = FiDT5.from_pretrained(t5).eval()
    ids = torch.randint(3, 100, (2, 3, 10))
    mask = torch.ones_like(ids)
    mask[0, 1, 4:] = 0
    mask[1, 0, 7:] = 0
    mask[1, 2] = 0
    labels = torch.randint(3, 100, (2, 4))
    out = {}
    for bucket in (0, 4):
        fid.encoder_bucket = bucket
        out[bucket] = (fid.get_encoder()(input_ids=ids, attention_mask=mask).last_hidden_state.view(2, 3, 10, -1),
                       fid(input_ids=ids, attention_mask=mask, labels=labels).logits,
                       fid.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, do_sample=False))
    real = mask.bool()
    assert torch.allclose(out[0][0][real], out[4][0][real], atol=1e-5)
    for past_width in (out[4][0][0, 1, 4:], out[4][0][1, 0, 8:], out[4][0][1, 2]):
        assert torch.count_nonzero(past_width) == 0
    assert torch.allclose(out[0][1], out[4][1], atol=1e-5) and torch.equal(out[0][2], out[4][2])


def test_t5_held_in_its_reading_dtype_answers_as_autocast_does(t5, monkeypatch):
    examples = [FiDExample(str(i), w["question"], w["answers"], [(c["title"], c["text"]) for c in w["ctxs"]])
                for i, w in enumerate(code_world(12, 4, 3))]
    assert_held_in_reading_dtype_reads_alike(t5, examples, 4, monkeypatch, batch_size=4, text_maxlength=32,
                                             max_new_tokens=4)


def test_collator_pads_missing_passages_and_keeps_the_best_k(t5, tmp_path):
    tok = AutoTokenizer.from_pretrained(t5)
    rows = [{"question": "what is the code of bob ?", "answers": ["3"],
             "ctxs": [{"title": "a", "text": "low", "score": 1.0}, {"title": "b", "text": "high", "score": 5.0}]}]
    path = tmp_path / "few.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ex = load_fid_file(path)
    assert [t for t, _ in ex[0].passages] == ["b", "a"]          # by score
    batch = FiDCollator(tok, k=4, text_maxlength=32)(ex)
    assert batch["input_ids"].shape[:2] == (1, 4)
    assert batch["attention_mask"][0, :2].sum() > 0 and batch["attention_mask"][0, 2:].sum() == 0
    # One target, so no padding: the answer's tokens then eos, none masked.
    assert batch["labels"].tolist() == [tok("3").input_ids]
    labels = FiDCollator(tok, k=4).encode_targets(["3", "the code of bob"])
    short = tok("3").input_ids
    assert labels[0, :len(short)].tolist() == short and (labels[0, len(short):] == -100).all()
    assert (labels[1] != -100).all()


def test_checkpoint_round_trip(t5, tmp_path):
    model, tok = load_reader(t5)
    model.save_pretrained(tmp_path / "again")
    tok.save_pretrained(tmp_path / "again")
    back, _ = load_reader(tmp_path / "again")
    for (n, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), n
    plain = T5ForConditionalGeneration.from_pretrained(tmp_path / "again")
    assert type(plain) is T5ForConditionalGeneration


def test_bad_checkpoints_are_refused(t5, tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        load_reader(tmp_path / "missing")
    small = tmp_path / "small_vocab"
    config = T5ForConditionalGeneration.from_pretrained(t5).config
    config.vocab_size = 50
    T5ForConditionalGeneration(config).save_pretrained(small)
    AutoTokenizer.from_pretrained(t5).save_pretrained(small)
    with pytest.raises(InputError, match="do not belong together"):
        load_reader(small)


def test_bad_fid_input_is_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "  ", "answers": ["x"], "ctxs": []}) + "\n")
    with pytest.raises(InputError, match=r"bad.jsonl:1: empty or missing"):
        load_fid_file(bad)
    with pytest.raises(InputError, match="not found"):
        load_fid_file(tmp_path / "nowhere.json")


def test_span_corruption_hides_spans_behind_sentinels():
    ids = list(range(10, 110))
    sentinels = [1000 + i for i in range(100)]
    src, tgt = span_corrupt(ids, sentinels, 1, random.Random(0))
    assert src[-1] == 1 and tgt[-1] == 1
    used = [s for s in src if s >= 1000]
    assert used == sentinels[:len(used)] and [t for t in tgt if t >= 1000] == used
    # Putting the spans back gives the original sequence; 15% of it is hidden.
    spans, cur = {}, None
    for t in tgt[:-1]:
        if t >= 1000:
            cur = t
            spans[cur] = []
        else:
            spans[cur].append(t)
    rebuilt = [x for s in src[:-1] for x in (spans[s] if s >= 1000 else [s])]
    assert rebuilt == ids
    assert sum(len(v) for v in spans.values()) == 15


def test_deepspeed_config_fills_every_auto(tmp_path):
    args = LoopArgs(out_dir=str(tmp_path), batch_size=3, accumulation=2, lr=1e-3, warmup_steps=10)
    config = deepspeed_config(args, total_steps=100, world=2, device=torch.device("cpu"))
    assert "auto" not in json.dumps(config)
    assert config["train_batch_size"] == 12 and config["zero_optimization"]["stage"] == 2
    assert config["optimizer"]["params"]["lr"] == 1e-3 and config["bf16"]["enabled"] is False
    args.zero_stage, args.offload = 3, True
    config = deepspeed_config(args, total_steps=100, world=1, device=torch.device("cpu"))
    assert config["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert config["optimizer"]["params"]["torch_adam"] is False       # DeepSpeedCPUAdam with offload
    # on CPU bf16 is autocast in the loop (tests/test_trainer.py), not DeepSpeed's bf16 weights
    config = deepspeed_config(LoopArgs(out_dir=str(tmp_path), precision="bf16"), 10, 1, torch.device("cpu"))
    assert config["bf16"]["enabled"] is False


# lr 1e-3: over six model seeds it reaches 72-100% EM by step 400 (100% for five); at 3e-3 how soon copying
# is found depends on the seed (19-100% at step 400), so any change to the vocabulary could fail the test.
def _args(t5, data, out, **loop):
    reader = from_flat(ReaderArgs, dict(model=str(t5), train_file=[str(data / "train.json")], validation_file=str(data / "val.json"),
                        k=4, text_maxlength=96, max_new_tokens=8))
    return reader, LoopArgs(out_dir=str(out), **{"batch_size": 16, "lr": 1e-3, "warmup_steps": 20, **loop})


def test_a_tiny_reader_learns_to_find_the_answer_among_k_passages(t5, data, tmp_path):
    """ZeRO-2 through DeepSpeed on CPU; chance is 10% EM."""
    result = train_reader(*_args(t5, data, tmp_path / "run", max_steps=400, eval_steps=200, save_steps=400,
                                 report_to="tensorboard"))
    assert_reported(tmp_path / "run", "em")
    assert result["history"][-1]["loss"] < 0.5 * result["history"][0]["loss"]
    assert result["best"]["value"] >= 40.0      # 4x chance
    summary = read_file(tmp_path / "run" / "best", data / "val.json", tmp_path / "pred.jsonl", k=4, text_maxlength=96)
    assert summary["em"] == pytest.approx(result["best"]["value"])
    lines = [json.loads(x) for x in (tmp_path / "pred.jsonl").read_text().splitlines()]
    assert len(lines) == 100 and {"id", "question", "answers", "prediction"} <= set(lines[0])


def test_an_interrupted_training_resumes_with_the_same_losses(t5, data, tmp_path, monkeypatch):
    def loop_args(out):
        return _args(t5, data, out, max_steps=8, batch_size=8, eval_steps=5, save_steps=3)

    assert_an_interrupted_training_resumes_with_the_same_losses(loop_args, tmp_path, monkeypatch)


def _train_cli(t5, data, out, accumulation, nproc):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           "-m", "odqa.system.cli", "-q", "train-reader", "--model", str(t5), "--train-file", str(data / "train.json"),
           "--validation-file", str(data / "val.json"), "--k", "4", "--text-maxlength", "96",
           "--max-validation", "16", "--out", str(out), "--max-steps", "3", "--batch-size", "4",
           "--accumulation", str(accumulation), "--lr", "3e-3", "--warmup-steps", "1", "--eval-steps", "3",
           "--save-steps", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, cwd=Path(__file__).parent.parent, capture_output=True, timeout=600)
    return json.loads((out / "trainer_state.json").read_text())


def test_two_processes_train_as_one_with_twice_the_accumulation(t5, data, tmp_path):
    two = _train_cli(t5, data, tmp_path / "two", accumulation=1, nproc=2)
    one = _train_cli(t5, data, tmp_path / "one", accumulation=2, nproc=1)
    assert [h["loss"] for h in two["history"]] == pytest.approx([h["loss"] for h in one["history"]], rel=1e-4)
    a = T5ForConditionalGeneration.from_pretrained(tmp_path / "two" / "last").state_dict()
    b = T5ForConditionalGeneration.from_pretrained(tmp_path / "one" / "last").state_dict()
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name


def test_reader_init_cli_builds_a_loadable_t5(tiny_corpus, tmp_path, capsys):
    from odqa.system.cli import main
    out = tmp_path / "init"
    assert main(["reader", "init", "--preset", "tiny", "--vocab-size", "400", "--corpus", str(tiny_corpus),
                 "--out", str(out)]) == 0
    assert "tiny T5" in capsys.readouterr().out
    model, tok = load_reader(out)
    assert model.config.vocab_size == len(tok) and model.config.d_model == 256
    assert json.loads((out / "reader_init.json").read_text())["preset"] == "tiny"


def test_read_cli_refuses_a_missing_checkpoint(data, tmp_path, capsys):
    from odqa.system.cli import main
    assert main(["read", "--model", str(tmp_path / "none"), "--input", str(data / "val.json"),
                 "--out", str(tmp_path / "p.jsonl")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()


def test_zero3_trains_like_zero2_and_saves_whole_weights(t5, data, tmp_path):
    """Stage 3 shards the parameters; the losses and the gathered checkpoint must not notice."""
    runs = {}
    for stage in (2, 3):
        reader, loop = _args(t5, data, tmp_path / f"z{stage}", max_steps=3, batch_size=4, eval_steps=3, save_steps=3,
                             zero_stage=stage)
        reader.max_validation = 8
        runs[stage] = train_reader(reader, loop)
    assert [h["loss"] for h in runs[3]["history"]] == pytest.approx([h["loss"] for h in runs[2]["history"]], rel=1e-4)
    a = T5ForConditionalGeneration.from_pretrained(tmp_path / "z2" / "last").state_dict()
    b = T5ForConditionalGeneration.from_pretrained(tmp_path / "z3" / "last").state_dict()
    for name in a:
        assert a[name].shape == b[name].shape and torch.allclose(a[name], b[name], atol=1e-5), name


def test_cloze_spans_are_names_and_numbers_not_sentence_openers():
    sentence = "The Eiffel Tower in Paris was completed in 1889 at a cost of 7,799,401 francs by the University of Lyon."
    spans = {sentence[a:b]: wh for a, b, wh in salient_spans(sentence, max_answer_words=5)}
    assert spans == {"Eiffel Tower": "what", "Paris": "what", "1889": "when", "7,799,401": "how many",
                     "University of Lyon": "what"}
    assert salient_spans("He said it twice.", 5) == []


def test_cloze_file_asks_about_a_span_of_one_passage_among_k(tiny_corpus, tmp_path, capsys):
    from odqa.system.cli import main
    out = tmp_path / "cloze.jsonl"
    assert main(["reader", "cloze", "--corpus", str(tiny_corpus), "--out", str(out), "--passages", "3",
                 "--per-passage", "2", "--min-words", "4"]) == 0
    assert "cloze questions from" in capsys.readouterr().out
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    examples = load_fid_file(out)
    assert rows and len(examples) == len(rows)
    for row in rows:
        answer, question = row["answers"][0], row["question"]
        assert len(row["ctxs"]) == 3 and question.endswith("?")
        sources = [c for c in row["ctxs"] if c["has_answer"]]
        source_docs = {c["id"].split("#")[0] for c in sources}
        # The question is a sentence of the source passage with the answer replaced by a wh-word.
        wh = next(w for w in ("how many", "when", "what") if w in question)
        before, after = question[:-1].split(wh, 1)
        assert any(before + answer + after in c["text"] for c in sources)
        # Distractors come from other documents.
        assert len({c["id"].split("#")[0] for c in row["ctxs"]} & source_docs) == 1
    # train-reader takes it as it is: every training question has its answer among the k passages.
    train, _ = split_examples(from_flat(ReaderArgs, dict(model="-", train_file=[str(out)], k=3, validation_percent=0)))
    assert len(train) == len(rows)


def test_cloze_refuses_a_corpus_it_cannot_draw_from(tmp_path, capsys):
    from odqa.system.cli import main
    one_doc = write_jsonl(tmp_path / "one.jsonl", [TINY_DOCS[0]])
    build_corpus([one_doc], tmp_path / "one")
    out = tmp_path / "cloze.jsonl"
    assert main(["reader", "cloze", "--corpus", str(tmp_path / "one"), "--out", str(out)]) == 2
    assert "more than one document" in capsys.readouterr().err
    lower = write_jsonl(tmp_path / "lower.jsonl", [{"id": d, "title": d, "sections": [
        {"title": "", "paragraphs": ["nothing here is named or counted in any way at all."]}]} for d in "ab"])
    build_corpus([lower], tmp_path / "lower")
    assert main(["reader", "cloze", "--corpus", str(tmp_path / "lower"), "--out", str(out)]) == 2
    assert "no sentence held a name or number" in capsys.readouterr().err and not out.exists()


def test_loop_settings_that_cannot_train_are_refused_before_any_model_loads(tmp_path):
    from odqa.common.io import InputError
    for bad in ({"eval_steps": 0}, {"warmup_steps": 0}, {"batch_size": 0}, {"max_steps": -1}, {"save_steps": -5},
                {"freeze_layers": -1}):
        with pytest.raises(InputError, match="must be at least [01]"):
            LoopArgs(out_dir=str(tmp_path), **bad)
    with pytest.raises(InputError, match="--lr: must be at least 0, not -1"):
        LoopArgs(out_dir=str(tmp_path), lr=-1)
    with pytest.raises(InputError, match="--lr 0 with no --new-lr trains nothing"):
        LoopArgs(out_dir=str(tmp_path), lr=0)
    assert LoopArgs(out_dir=str(tmp_path), lr=0, new_lr=1e-3).lr == 0     # only the new weights train


def test_the_report_and_its_plots_are_written_atomically(tmp_path, monkeypatch):
    from odqa.common import io
    from odqa.system.report import write_report
    records = [{"dataset": "d", "extractive_em": 1, "k": {"1": {"generated_em": 0, "hit": 1}}}]
    published = []
    real = io.publish
    monkeypatch.setattr(io, "publish", lambda tmp, path: published.append(path.name) or real(tmp, path))
    write_report(records, tmp_path, curves={"d": {"phrase": [[True]]}}, max_k=1)
    assert {"report.json", "report.md", "em_by_k.png", "topk.png"} <= set(published)
    assert (tmp_path / "em_by_k.png").read_bytes()[:4] == b"\x89PNG"


def test_pretraining_reports_to_tensorboard(t5, tmp_path):
    """pretrain-reader is a trainer of the loop too: --report-to writes its event file."""
    from odqa.common.corpus import build_corpus
    from odqa.reader.args import PretrainArgs
    from odqa.reader.pretrain import pretrain_reader
    build_corpus([write_jsonl(tmp_path / "docs.jsonl", TINY_DOCS)], tmp_path / "corpus")
    pretrain_reader(PretrainArgs(model=str(t5), corpus=str(tmp_path / "corpus"), input_length=32, validation_passages=2,
                                 eval_batch_size=2),
                    LoopArgs(out_dir=str(tmp_path / "pre"), backend="accelerate", batch_size=2, max_steps=4,
                             eval_steps=2, save_steps=4, warmup_steps=1, log_steps=2, report_to="tensorboard"))
    assert_reported(tmp_path / "pre", "neg_loss")


def test_reading_stops_at_the_next_decoding_step_once_its_deadline_passes(tmp_path, monkeypatch):
    """The server's timeout reaches into decoding: with a clock that passes the deadline after a few
    steps, generate raises PastDeadline having run those steps only; no deadline, the same answers as
    before."""
    import itertools

    from tiny_models import make_tiny_t5

    from odqa.common import timings
    from odqa.common.timings import PastDeadline, deadline
    from odqa.reader.args import ReaderSettings
    from odqa.reader.fid_data import FiDExample
    from odqa.reader.read import generate, load_reader
    texts = ["the code of bob is 7 .", "question: what is the code of bob ? title: t context: bob likes chess ."]
    model, tok = load_reader(make_tiny_t5(tmp_path / "t5", texts * 4, vocab_size=300))
    examples = [FiDExample("0", "what is the code of bob ?", [], [("t", "the code of bob is 7 .")])]
    settings = ReaderSettings(decoding="free", max_new_tokens=30, num_beams=2)
    free = generate(model, tok, examples, [1], settings)
    ticks = itertools.count()
    monkeypatch.setattr(timings, "clock", lambda: next(ticks))
    with deadline(5), pytest.raises(PastDeadline):
        generate(model, tok, examples, [1], settings)
    assert next(ticks) < 12        # three stage checks and a few steps: not thirty
    monkeypatch.setattr(timings, "clock", time.perf_counter)
    with deadline(time.perf_counter() + 600):
        assert generate(model, tok, examples, [1], settings) == free
