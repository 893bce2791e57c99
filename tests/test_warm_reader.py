"""The warm-started (bert2bert) FiD reader on a tiny BERT made in the test: the checkpoint's round trip
with its tied embedding, FiD at k = 1 is the plain EncoderDecoderModel, span-constrained answers are
passage spans in the passage's own characters, the synthetic task learnt through DeepSpeed ZeRO-2,
new weights at their own rate, resume."""
import json

import pytest
import torch
from reader_checks import (
    assert_an_interrupted_training_resumes_with_the_same_losses,
    assert_held_in_reading_dtype_reads_alike,
    generated,
    read_file,
)
from safetensors import safe_open
from tiny_data import CODE_NAMES, HOBBIES, code_world
from tiny_models import make_tiny_bert
from transformers import AutoTokenizer, EncoderDecoderModel

from odqa.common.io import InputError
from odqa.common.metrics.answers import is_echo
from odqa.common.settings import from_flat, updated
from odqa.reader.args import LoopArgs, ReaderInitArgs, ReaderSettings
from odqa.reader.fid import FiDEncoderDecoder
from odqa.reader.fid_data import FiDCollator, FiDExample, load_fid_file
from odqa.reader.fid_train import ReaderArgs, train_reader
from odqa.reader.read import generate, load_reader
from odqa.reader.spans import PassageSpans
from odqa.reader.warm_start import decoder_layer_sources, init_warm_reader

TEXTS = ([f"the code of {n} is {d} ." for n in CODE_NAMES for d in range(10)]
         + [f"question: what is the code of {n} ? title: people context: {n} likes {h} ." for n in CODE_NAMES for h in HOBBIES]
         + ["Wilhelm Conrad Röntgen measured 1.71 m, the e-mail said; an apple a day."])


@pytest.fixture(scope="module")
def b2b(tmp_path_factory):
    root = tmp_path_factory.mktemp("b2b")
    bert = make_tiny_bert(root / "bert", TEXTS, hidden=64, layers=2)
    init_warm_reader(bert, root / "init", ReaderInitArgs(decoder_layers=2, pointer=False))
    return root / "init"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("fid_data")
    (root / "train.json").write_text(json.dumps(code_world(800, 4, 0)))
    (root / "val.json").write_text(json.dumps(code_world(100, 4, 1)))
    return root


def _embeddings(model):
    return [model.encoder.embeddings.word_embeddings.weight, model.decoder.bert.embeddings.word_embeddings.weight,
            model.decoder.cls.predictions.decoder.weight]


def test_warm_start_round_trip_keeps_one_tied_embedding(b2b, tmp_path):
    model, tok = load_reader(b2b)
    assert isinstance(model, FiDEncoderDecoder)
    assert len({w.data_ptr() for w in _embeddings(model)}) == 1
    with safe_open(str(b2b / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "encoder.embeddings.word_embeddings.weight" in keys
    assert "decoder.bert.embeddings.word_embeddings.weight" not in keys
    info = json.loads((b2b / "reader_init.json").read_text())
    assert info["decoder_layer_sources"] == [0, 1] and info["kind"] == "bert2bert"
    # The decoder's layers start as the encoder's, cross-attention as the layer's own self-attention.
    src = model.encoder.encoder.layer[1]
    dst = model.decoder.bert.encoder.layer[1]
    assert torch.equal(dst.attention.self.query.weight, src.attention.self.query.weight)
    assert torch.equal(dst.crossattention.self.key.weight, src.attention.self.key.weight)
    # Train a step so that the tie is tested on weights that moved, then save and load again.
    ids = torch.randint(5, len(tok), (2, 1, 8))
    loss = model.train()(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.randint(5, len(tok), (2, 3))).loss
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:       # the encoder's pooler takes no part
                p -= 0.1 * p.grad
    model.save_pretrained(tmp_path / "again")
    tok.save_pretrained(tmp_path / "again")
    back, _ = load_reader(tmp_path / "again")
    assert len({w.data_ptr() for w in _embeddings(back)}) == 1
    mine, theirs = model.state_dict(), back.state_dict()
    assert mine.keys() == theirs.keys()
    for name in mine:
        assert torch.equal(mine[name], theirs[name]), name


def test_fid_with_one_passage_is_the_plain_encoder_decoder(b2b):
    fid, tok = load_reader(b2b)
    v = len(tok)
    plain = EncoderDecoderModel(fid.config).eval()
    plain.load_state_dict(fid.state_dict())
    ids = torch.randint(5, v, (2, 1, 9))
    mask = torch.ones_like(ids)
    mask[1, 0, 6:] = 0
    labels = torch.randint(5, v, (2, 4))
    a = fid(input_ids=ids, attention_mask=mask, labels=labels)
    b = plain(input_ids=ids[:, 0], attention_mask=mask[:, 0], labels=labels)
    assert torch.allclose(a.logits, b.logits, atol=1e-5) and torch.allclose(a.loss, b.loss, atol=1e-6)
    # k passages: generate() sees the same fused encoder as forward().
    ids3 = torch.randint(5, v, (2, 3, 7))
    out = fid.generate(input_ids=ids3, attention_mask=torch.ones_like(ids3), max_new_tokens=4, do_sample=False)
    dec = out[:, :1]
    for _ in range(out.shape[1] - 1):
        logits = fid(input_ids=ids3, attention_mask=torch.ones_like(ids3), decoder_input_ids=dec).logits[:, -1]
        dec = torch.cat([dec, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, dec)


def test_a_bert_that_lacks_a_weight_is_refused_not_warm_started_at_random(tmp_path):
    """A BERT checkpoint without its pooler warm-starts (the reader never uses it); one without a layer's
    weight is refused by name, and no reader is written."""
    from safetensors.torch import load_file, save_file
    bert = make_tiny_bert(tmp_path / "bert", TEXTS, hidden=32, layers=2)
    weights = load_file(bert / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("pooler.")}, bert / "model.safetensors")
    init_warm_reader(bert, tmp_path / "no-pooler", ReaderInitArgs(decoder_layers=1, pointer=False))
    lost = "encoder.layer.1.output.dense.weight"
    save_file({k: v for k, v in weights.items() if k != lost}, bert / "model.safetensors")
    with pytest.raises(InputError, match=rf"missing 1 \({lost}\)"):
        init_warm_reader(bert, tmp_path / "init", ReaderInitArgs(decoder_layers=1, pointer=False))
    assert not (tmp_path / "init").exists()


def test_decoder_layers_are_checked():
    assert decoder_layer_sources(6, 2) == [0, 3] and decoder_layer_sources(6, 6) == list(range(6))
    with pytest.raises(InputError, match="decoder-layers"):
        decoder_layer_sources(6, 7)


def test_span_rules_keep_numbers_whole_and_map_back_to_the_passage(b2b):
    tok = AutoTokenizer.from_pretrained(b2b)
    ex = FiDExample("x", "who?", [], [("Wilhelm Röntgen", "Wilhelm Conrad Röntgen measured 1.71 m, the e-mail said.")])
    batch = FiDCollator(tok, 1, 64).encode_passages([ex], offsets=True)
    spans = PassageSpans(batch["input_ids"], batch["offset_mapping"], batch["fields"], tok.sep_token_id,
                         tok.pad_token_id)

    def ids(text):
        return tok(text, add_special_tokens=False).input_ids

    assert spans.surface(0, ids("rontgen")) == "Röntgen"            # accents back, from the title first
    assert spans.surface(0, ids("1.71")) == "1.71"
    assert spans.surface(0, ids("conrad rontgen measured")) == "Conrad Röntgen measured"
    assert spans.surface(0, ids("measured wilhelm")) is None          # no such span
    eos = tok.sep_token_id
    assert eos not in spans.allowed(0, ids("1"))                      # not "1" of "1.71"
    assert ids(".")[0] in spans.allowed(0, ids("1"))
    assert eos in spans.allowed(0, ids("1.71"))
    assert eos in spans.allowed(0, ids("e-mail")) and eos not in spans.allowed(0, ids("e-"))
    first = spans.allowed(0, [])      # words start a span; articles and punctuation do not
    assert ids("measured")[0] in first and ids("e")[0] in first
    assert ids("the")[0] not in first and ids(".")[0] not in first and ids("-")[0] not in first


def test_constrained_answers_are_always_spans_of_the_passages(b2b):
    """An untrained reader's answers, on passages of random words, each from one of the passages."""
    model, tok = load_reader(b2b)
    words = [w for t in TEXTS for w in t.split() if w.isalpha()]
    g = torch.Generator().manual_seed(0)
    examples = []
    for i in range(12):
        pick = torch.randint(len(words), (3, 9), generator=g).tolist()
        examples.append(FiDExample(str(i), "what is the code of bob ?", [],
                                   [(words[p[0]].title(), " ".join(words[j] for j in p[1:])) for p in pick]))
    for beams in (1, 3):
        answers = generated(model, tok, examples, 3, batch_size=4, text_maxlength=32, max_new_tokens=6,
                                   num_beams=beams, decoding="spans")
        for ex, a in zip(examples, answers):
            assert a and any(a in t or a in p for t, p in ex.passages), (a, ex.passages)
            assert a.split()[0].lower() not in ("the", "a", "an")
    free = generated(model, tok, examples, 3, batch_size=4, text_maxlength=32, max_new_tokens=6,
                     decoding="free")
    assert len(free) == len(examples)
    with pytest.raises(InputError, match="decoding"):
        generated(model, tok, examples, 3, decoding="beam-me-up")


def test_answers_that_repeat_the_question_are_decoded_again(b2b_pointer):
    """Passages made mostly of the question's own words: greedy decoding of an untrained reader answers
    some with an echo of the question; refused, each answer is decoded again without the echo's first
    word, and with at most two such first words in a passage no answer stays an echo."""
    model, tok = load_reader(b2b_pointer)
    words = sorted({w for t in TEXTS for w in t.split() if w.isalpha() and w not in ("the", "a", "an", "what", "is")})
    g = torch.Generator().manual_seed(0)
    examples = []
    for i in range(24):
        x, y, other = [words[j] for j in torch.randperm(len(words), generator=g)[:3].tolist()]
        examples.append(FiDExample(str(i), f"what is {x} {y} ?", [], [("", f"{x} {y} {other} {y}"), ("", f"{y} {x}")]))
    kept = generated(model, tok, examples, 2, batch_size=8, text_maxlength=32, max_new_tokens=4,
                            progress=False, refuse_echoes=False)
    refused = generated(model, tok, examples, 2, batch_size=8, text_maxlength=32, max_new_tokens=4,
                               progress=False)
    echoes = [is_echo(a, ex.question) for a, ex in zip(kept, examples)]
    assert 0 < sum(echoes) < len(examples)
    assert not any(is_echo(a, ex.question) for a, ex in zip(refused, examples)), refused
    assert [a for a, e in zip(refused, echoes) if not e] == [a for a, e in zip(kept, echoes) if not e]
    spans = PassageSpans(torch.tensor([[[5, 6, 7]]]), torch.tensor([[[[0, 1], [2, 3], [4, 5]]]]),
                         [[[(0, 5, "a b c")]]], eos_id=1, pad_id=0)
    spans.ban_first(0, 5)
    assert 5 not in spans.allowed(0, []) and 6 in spans.allowed(0, [])


@pytest.mark.parametrize("kind", ["plain", "pointer", "prior"])
def test_several_k_from_one_encoder_pass_equal_separate_reads(b2b, b2b_pointer, b2b_prior, kind):
    model, tok = load_reader({"plain": b2b, "pointer": b2b_pointer, "prior": b2b_prior}[kind])
    if kind == "prior":
        with torch.no_grad():
            model.passage_scorer.weight.normal_(0, 1.0)
    examples = [FiDExample(str(i), w["question"], w["answers"], [(c["title"], c["text"]) for c in w["ctxs"]])
                for i, w in enumerate(code_world(10, 4, 2))]
    by_k = generate(model, tok, examples, [4, 1, 2], ReaderSettings(batch_size=4, text_maxlength=32, max_new_tokens=4))
    assert list(by_k) == [1, 2, 4]
    for k, answers in by_k.items():
        assert answers == generated(model, tok, examples, k, batch_size=4, text_maxlength=32, max_new_tokens=4,
                                           progress=False)


@pytest.mark.parametrize("kind", ["plain", "pointer", "prior"])
def test_a_reader_held_in_its_reading_dtype_answers_as_autocast_does(b2b, b2b_pointer, b2b_prior, kind, monkeypatch):
    examples = [FiDExample(str(i), w["question"], w["answers"], [(c["title"], c["text"]) for c in w["ctxs"]])
                for i, w in enumerate(code_world(12, 4, 3))]
    assert_held_in_reading_dtype_reads_alike({"plain": b2b, "pointer": b2b_pointer, "prior": b2b_prior}[kind],
                                             examples, 4, monkeypatch, batch_size=4, text_maxlength=32,
                                             max_new_tokens=4)


def _args(model, data, out, **loop):
    reader = from_flat(ReaderArgs, dict(model=str(model), train_file=[str(data / "train.json")], validation_file=str(data / "val.json"),
                        k=4, text_maxlength=48, max_new_tokens=6, max_validation_examples=100))
    return reader, LoopArgs(out_dir=str(out), **{"batch_size": 16, "lr": 1e-3, "warmup_steps": 20, **loop})


def test_a_tiny_warm_started_reader_learns_to_find_the_answer_among_k_passages(b2b, data, tmp_path):
    """Through DeepSpeed ZeRO-2 on CPU. The digit is one of ten and sits in one of the 4 passages."""
    result = train_reader(*_args(b2b, data, tmp_path / "run", max_steps=300, eval_steps=150, save_steps=300))
    assert result["history"][-1]["loss"] < 0.5 * result["history"][0]["loss"]
    assert result["best"]["value"] >= 40.0
    summary = read_file(tmp_path / "run" / "best", data / "val.json", tmp_path / "pred.jsonl", k=4, text_maxlength=48)
    assert summary["em"] == pytest.approx(result["best"]["value"])
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["deepspeed"]["zero_optimization"]["stage"] == 2


def test_new_weights_train_at_their_own_rate(b2b, data, tmp_path):
    """lr 0 for what came from the pretrained encoder, new_lr for cross-attention and the LM head."""
    reader, loop = _args(b2b, data, tmp_path / "groups", max_steps=3, batch_size=4, warmup_steps=1, eval_steps=3,
                         save_steps=3, lr=0.0, new_lr=1e-2)
    reader.max_validation = 4
    train_reader(reader, loop)
    before, _ = load_reader(b2b)
    after, _ = load_reader(tmp_path / "groups" / "last")
    new = before.new_parameters()
    assert any(".crossattention." in n for n in new) and "decoder.cls.predictions.transform.dense.weight" in new
    b, a = dict(before.named_parameters()), dict(after.named_parameters())   # tied weights once
    for name in b:
        if name in new:
            assert not torch.equal(a[name], b[name]), name
        else:
            assert torch.equal(a[name], b[name]), name


def test_frozen_embeddings_and_bottom_blocks_stay_as_they_were_and_the_rest_trains(b2b, data, tmp_path):
    """--freeze-embeddings --freeze-layers 1 through DeepSpeed: the shared word embeddings (the decoder's
    input and output ones too) and the encoder's first block come out unchanged, its second block and
    the decoder do not; a block count past the encoder's is refused before training."""
    reader, loop = _args(b2b, data, tmp_path / "frozen", max_steps=3, batch_size=4, warmup_steps=1, eval_steps=3,
                         save_steps=3, lr=1e-2, freeze_embeddings=True, freeze_layers=1)
    reader.max_validation = 4
    train_reader(reader, loop)
    before, _ = load_reader(b2b)
    after, _ = load_reader(tmp_path / "frozen" / "last")
    b, a = dict(before.named_parameters()), dict(after.named_parameters())
    frozen = [n for n in b if n.startswith(("encoder.embeddings.", "encoder.encoder.layer.0."))]
    assert frozen and all(torch.equal(a[n], b[n]) for n in frozen)
    for x, y in zip(_embeddings(before), _embeddings(after)):
        assert torch.equal(x, y)
    for prefix in ("encoder.encoder.layer.1.", "decoder.bert.encoder.layer.0."):
        assert any(not torch.equal(a[n], b[n]) for n in b if n.startswith(prefix)), prefix
    with pytest.raises(InputError, match="--freeze-layers"):
        train_reader(*_args(b2b, data, tmp_path / "too-many", max_steps=1, freeze_layers=3))
    # Resumed with every weight trained, its optimizer would not fit the checkpoint's: refused by name,
    # before DeepSpeed loads anything, and the checkpoint is kept. The settings the run recorded say so
    # first; without that record the checkpoint's own weight counts do.
    _, unfrozen = _args(b2b, data, tmp_path / "frozen", max_steps=5, batch_size=4, warmup_steps=1, eval_steps=5,
                        save_steps=5, lr=1e-2, resume=True)
    with pytest.raises(InputError, match=r"--resume: .*train_config.json .*freeze_embeddings True there, False here"):
        train_reader(reader, unfrozen)
    (tmp_path / "frozen" / "train_config.json").unlink()
    with pytest.raises(InputError, match=r"--resume: .*checkpoint.*group_sizes \[[\d, ]+\] there, \[[\d, ]+\] here"):
        train_reader(reader, unfrozen)
    assert json.loads((tmp_path / "frozen" / "checkpoint" / "trainer_state.json").read_text())["global_step"] == 3


def test_an_interrupted_warm_reader_training_resumes_with_the_same_losses(b2b, data, tmp_path, monkeypatch):
    def loop_args(out):
        return _args(b2b, data, out, max_steps=8, batch_size=8, eval_steps=5, save_steps=3, new_lr=3e-3)

    assert_an_interrupted_training_resumes_with_the_same_losses(loop_args, tmp_path, monkeypatch)


def test_reader_init_cli_warm_starts_from_an_encoder(b2b, tmp_path, capsys):
    from odqa.system.cli import main
    bert = next(b2b.parent.glob("bert"))
    out = tmp_path / "init"
    assert main(["reader", "init", "--from", str(bert), "--decoder-layers", "1", "--out", str(out)]) == 0
    assert "bert2bert" in capsys.readouterr().out
    model, tok = load_reader(out)
    assert model.config.decoder.num_hidden_layers == 1 and model.config.decoder_start_token_id == tok.cls_token_id
    assert model.pointing and model.has_passage_prior      # the defaults
    assert main(["reader", "init", "--from", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "--from" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["reader", "init", "--from", str(bert), "--passage-prior", "--out", str(tmp_path / "prior")]) == 0
    assert "passage prior" in capsys.readouterr().out and load_reader(tmp_path / "prior")[0].has_passage_prior
    assert main(["reader", "init", "--from", str(bert), "--passage-prior", "--no-pointer", "--out", str(tmp_path / "y")]) == 2
    assert "--pointer" in capsys.readouterr().err and not (tmp_path / "y").exists()


def test_targets_leave_out_a_leading_article():
    from odqa.reader.fid_data import strip_article
    assert strip_article("the Saint Lawrence River") == "Saint Lawrence River"
    assert strip_article("An apple") == "apple" and strip_article("the") == "the" and strip_article("Theo") == "Theo"


def test_the_target_is_the_answer_as_the_passages_write_it():
    from odqa.reader.fid_data import pick_target
    ex = FiDExample("x", "what was beijing called?", ["the peking", "Beijing old name"],
                    [("Beijing", "Beijing was once known in English as Peking."), ("The Peking duck", "A dish.")],
                    has_answer=[False, True])
    assert pick_target(ex, None) == "Peking"          # from the answer-bearing passage, its casing, no article
    assert pick_target(ex, None, k=1) == "peking"     # the passage that holds it is beyond k: the gold string
    ex.target = "The Given"
    assert pick_target(ex, None) == "Given"


def test_a_supervision_file_reads_as_each_question_with_its_answer_bearing_passage(tmp_path):
    """`odqa supervise`'s train.jsonl is a FiD file of k = 1: the reader's first phase on it needs no
    conversion step."""
    row = {"id": "q1", "question": "what was beijing called?", "answers": ["peking"], "passage_id": "Beijing#0",
           "title": "Beijing", "text": "Beijing was once known in English as Peking.", "answer_char_spans": [[37, 43]],
           "bm25_rank": 3}
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "q2", "answer_char_spans": [[37, 99]]}) + "\n")
    [ex] = load_fid_file(path, limit=1)
    assert (ex.id, ex.question, ex.answers) == ("q1", "what was beijing called?", ["peking"])
    assert ex.passages == [("Beijing", row["text"])] and ex.has_answer == [True]
    assert ex.target == "Peking"                      # as the passage writes it
    with pytest.raises(InputError, match=r"train.jsonl:2: \"answer_char_spans\" must be"):
        load_fid_file(path)


def test_span_loss_is_a_softmax_over_what_span_decoding_may_choose(b2b):
    model, tok = load_reader(b2b)
    examples = [FiDExample("0", "what is the code of bob ?", ["7"], [("people", "the code of bob is 7 .")]),
                FiDExample("1", "what is the code of ivan ?", ["no such span"], [("people", "ivan likes tea .")])]
    batch = FiDCollator(tok, 1, 32, span_loss=True)(examples)
    assert set(batch) == {"input_ids", "attention_mask", "labels", "label_allowed"}
    allowed, labels = batch["label_allowed"], batch["labels"]
    first = {t for t in allowed[0, 0].tolist() if t >= 0}
    assert labels[0, 0].item() in first and tok.convert_tokens_to_ids("the") not in first   # words of the passage
    assert first <= set(tok("people the code of bob is 7 .", add_special_tokens=False).input_ids)
    assert (allowed[1] == -1).all()              # not a span: learnt over the whole vocabulary
    loss = model(**batch).loss
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=model.prepare_decoder_input_ids_from_labels(labels)).logits
    terms = []
    for b in range(2):
        for t in range(labels.size(1)):
            if labels[b, t] < 0:
                continue
            row = logits[b, t]
            keep = [a for a in allowed[b, t].tolist() if a >= 0]
            if keep:
                row = row[keep]
                target = keep.index(labels[b, t].item())
            else:
                target = labels[b, t].item()
            terms.append(-torch.log_softmax(row, -1)[target])
    assert torch.allclose(loss, torch.stack(terms).mean(), atol=1e-5)


def test_an_unknown_decoding_is_refused_before_training(b2b, data, tmp_path):
    """Refused when the settings are made, from flags or in Python: before any model loads."""
    reader, loop = _args(b2b, data, tmp_path / "bad", max_steps=3)
    for bad in ("beam-me-up", "phrases"):   # phrases: validation reads files without phrase scores
        with pytest.raises(InputError, match="--decoding"):
            updated(reader, decoding=bad)
    assert not (tmp_path / "bad").exists()


@pytest.fixture(scope="module")
def b2b_pointer(b2b):
    out = b2b.parent / "init-pointer"
    init_warm_reader(next(b2b.parent.glob("bert")), out, ReaderInitArgs(decoder_layers=2, pointer=True, passage_prior=False))
    return out


def test_the_pointer_adds_the_passages_tokens_to_the_vocabulary_distribution(b2b, b2b_pointer):
    """Same weights; where a token occurs in the input, its probability mass grows by the pointer's, and
    nowhere else do the logits change. The flag survives save and load; generate() (greedy and beams)
    decodes what forward() scores."""
    plain, tok = load_reader(b2b)
    model, _ = load_reader(b2b_pointer)
    assert model.pointing and not plain.pointing and json.loads((b2b_pointer / "reader_init.json").read_text())["pointer"]
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), model.state_dict().values()))
    v = len(tok)
    ids = torch.randint(5, v // 2, (2, 3, 7))       # source tokens from the lower half of the vocabulary only
    mask = torch.ones_like(ids)
    mask[1, 2] = 0                                  # an empty passage: its tokens must not be pointed at
    labels = torch.randint(5, v, (2, 4))
    a = model(input_ids=ids, attention_mask=mask, labels=labels)
    b = plain(input_ids=ids, attention_mask=mask, labels=labels)
    source = torch.zeros(2, v, dtype=torch.bool)
    for r in range(2):
        source[r, ids[r][mask[r] == 1]] = True
    gained = a.logits > b.logits + 1e-6
    assert torch.equal(gained, source[:, None, :].expand_as(gained))
    assert torch.allclose(a.logits[~gained], b.logits[~gained])
    a.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.zero_grad()
    for beams in (1, 3):
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, num_beams=beams)
        assert out.shape[0] == 2
    greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    dec = greedy[:, :1]
    for _ in range(greedy.shape[1] - 1):
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits[:, -1]
        dec = torch.cat([dec, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(greedy, dec)


@pytest.mark.parametrize("prior", [False, True])
def test_a_tiny_pointer_reader_learns_the_k_passage_task(b2b_pointer, b2b_prior, data, tmp_path, prior):
    """With the passage prior too, through DeepSpeed: its scorer learns (it starts at zero)."""
    result = train_reader(*_args(b2b_prior if prior else b2b_pointer, data, tmp_path / "run", max_steps=150,
                                 eval_steps=150, save_steps=150))
    assert result["best"]["value"] >= 40.0
    if prior:
        assert load_reader(tmp_path / "run" / "last")[0].passage_scorer.weight.abs().sum() > 0


def test_the_pointer_and_prior_train_under_cpu_bf16_autocast(b2b_prior, data):
    """`--precision bf16` on CPU: the pointer's mixture and the passage loss run in float32 inside the
    bfloat16 forward, so the loss is finite, near float32's, and its gradients reach float32 weights."""
    model, tok = load_reader(b2b_prior)
    batch = FiDCollator(tok, 4, 96, 8, span_loss=True)(load_fid_file(data / "train.json")[:6])
    exact = model(**batch).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.loss)
    assert out.loss.item() == pytest.approx(exact.item(), rel=0.05)
    out.loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float32 and torch.isfinite(g).all() for g in grads)
    assert model.passage_scorer.weight.grad.abs().sum() > 0


def test_the_reader_reads_under_bfloat16_autocast_where_the_dtype_says(b2b_prior, data, monkeypatch):
    """`search_dtype` (ODQA_SEARCH_DTYPE) picks the precision the reader reads in: bfloat16 is autocast
    around the encoder and every decoding step, float32 is not; the answers stay passage spans."""
    model, tok = load_reader(b2b_prior)
    examples = load_fid_file(data / "val.json", limit=8)
    seen = []
    hooks = [m.register_forward_hook(lambda *_: seen.append(torch.get_autocast_dtype("cpu")
                                                             if torch.is_autocast_enabled("cpu") else None))
             for m in (model.encoder, model.decoder)]
    read = {}
    for env in ("float32", "bfloat16"):
        monkeypatch.setenv("ODQA_SEARCH_DTYPE", env)
        seen.clear()
        read[env] = generated(model, tok, examples, 4, batch_size=4, text_maxlength=96, max_new_tokens=6,
                                     progress=False)
        assert set(seen) == {torch.bfloat16 if env == "bfloat16" else None}
        for ex, a in zip(examples, read[env]):
            assert a and any(a in t or a in p for t, p in ex.passages[:4])
    for h in hooks:
        h.remove()
    assert sum(a == b for a, b in zip(read["float32"], read["bfloat16"])) >= len(examples) // 2


@pytest.fixture(scope="module")
def b2b_prior(b2b):
    out = b2b.parent / "init-prior"
    init_warm_reader(next(b2b.parent.glob("bert")), out, ReaderInitArgs(decoder_layers=2, pointer=True, passage_prior=True))
    return out


def test_a_passage_prior_starts_uniform_and_weighs_the_pointer_by_passage(b2b_pointer, b2b_prior, tmp_path):
    """A fresh prior is uniform: the reader reads exactly as the pointer reader with the same weights.
    A trained one shifts each passage's pointer scores by log(n p(passage)) over the n present passages;
    it survives save and load; a prior without the pointer is refused."""
    pointer, tok = load_reader(b2b_pointer)
    model, _ = load_reader(b2b_prior)
    assert model.has_passage_prior and not pointer.has_passage_prior
    assert "passage_scorer.weight" in model.new_parameters()
    ids = torch.randint(5, len(tok), (2, 3, 7))
    mask = torch.ones_like(ids)
    mask[1, 2] = 0
    dec = torch.randint(5, len(tok), (2, 4))
    assert torch.allclose(model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits,
                          pointer(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits, atol=1e-5)

    with torch.no_grad():
        model.passage_scorer.weight.normal_(0, 1.0)
    enc = model.get_encoder()(input_ids=ids, attention_mask=mask, return_dict=True)
    prior = model.passage_log_prior(enc, mask.flatten(1))
    assert prior.shape == (2, 3) and prior[1, 2] == 0
    assert torch.allclose(prior[0].exp().sum(), torch.tensor(3.0)) and torch.allclose(prior[1, :2].exp().sum(),
                                                                                       torch.tensor(2.0))
    assert torch.isfinite(model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits).all()
    model.save_pretrained(tmp_path / "saved")
    tok.save_pretrained(tmp_path / "saved")   # a reader is saved with its tokenizer; a directory without one is refused
    again, _ = load_reader(tmp_path / "saved")
    assert torch.equal(again.passage_scorer.weight, model.passage_scorer.weight)
    with pytest.raises(InputError, match="--pointer"):
        init_warm_reader(next(b2b_prior.parent.glob("bert")), tmp_path / "x", ReaderInitArgs(pointer=False, passage_prior=True))


def test_the_passage_loss_learns_which_passages_hold_the_answer(b2b_prior, data):
    """The collator hands the retrieval file's has_answer to the model; trained on the passage loss
    alone, the encoder and its passage scorer rank the answer's passage first."""
    model, tok = load_reader(b2b_prior)
    examples = load_fid_file(data / "train.json")[:32]
    batch = FiDCollator(tok, 4, 48)(examples)
    assert torch.equal(batch["passage_labels"], torch.tensor([[int(h) for h in ex.has_answer[:4]] for ex in examples]))
    mask = batch["attention_mask"].flatten(1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    losses = []
    for _ in range(40):
        enc = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True)
        loss = model.passage_loss(enc, mask, batch["passage_labels"])
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert losses[-1] < 0.25 * losses[0]
    top = model.passage_log_prior(enc, mask).argmax(-1)
    assert (batch["passage_labels"][torch.arange(len(examples)), top] == 1).float().mean() > 0.9
    model.eval()
    with torch.no_grad():
        enc = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], return_dict=True)
        once = model.passage_loss(enc, mask, batch["passage_labels"])
        model.config.passage_loss_coef = 3.0      # what train-reader --passage-loss-coef sets
        assert torch.allclose(model.passage_loss(enc, mask, batch["passage_labels"]), 3 * once)


def test_a_negative_passage_loss_coef_is_refused_before_training(b2b_prior, data, tmp_path):
    reader, loop = _args(b2b_prior, data, tmp_path / "out", max_steps=2)
    reader.passage_loss_coef = -1.0
    with pytest.raises(InputError, match="--passage-loss-coef"):
        train_reader(reader, loop)
    assert not (tmp_path / "out" / "reader_args.json").exists()


def test_passages_encoded_in_length_groups_read_as_one_padded_call(b2b_prior):
    """FusedEncoder's buckets: passages of 3, 6 and 11 tokens and an absent one, encoded in groups of
    their own length, give the one padded call's states on real tokens, zeros past each group's
    width, and the same loss, gradients and generated answer."""
    model, tok = load_reader(b2b_prior)
    with torch.no_grad():
        model.passage_scorer.weight.normal_(0, 1.0)
    ids = torch.randint(5, len(tok), (2, 2, 11))
    mask = torch.ones_like(ids)
    mask[0, 0, 3:] = 0
    mask[0, 1, 6:] = 0
    mask[1, 1] = 0                                          # an absent passage
    labels = torch.randint(5, len(tok), (2, 3))
    calls = []
    model.encoder.register_forward_hook(lambda m, a, kw, out: calls.append(kw["input_ids"].shape), with_kwargs=True)
    runs = {}
    for bucket in (0, 4):
        model.encoder_bucket = bucket
        model.zero_grad()
        enc = model.get_encoder()(input_ids=ids, attention_mask=mask)
        calls[:] = []
        out = model(input_ids=ids, attention_mask=mask, labels=labels, passage_labels=torch.tensor([[1, 0], [1, 0]]))
        out.loss.backward()
        runs[bucket] = (enc.last_hidden_state.view(2, 2, 11, -1), out.loss.detach(),
                        [p.grad.clone() for p in model.parameters() if p.grad is not None], list(calls),
                        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False))
    (one, loss0, grads0, calls0, gen0), (grouped, loss4, grads4, calls4, gen4) = runs[0], runs[4]
    assert calls0 == [(4, 11)]                               # the forward's encoder calls
    assert sorted(calls4) == [(1, 4), (1, 8), (1, 11)]       # 3, 6 and 11 tokens; the absent one not encoded
    real = mask.bool()
    assert torch.allclose(one[real], grouped[real], atol=1e-5)
    for past_width in (grouped[0, 0, 4:], grouped[0, 1, 8:], grouped[1, 1]):
        assert torch.count_nonzero(past_width) == 0
    assert torch.allclose(loss0, loss4, atol=1e-5)
    assert len(grads0) == len(grads4) and all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads0, grads4))
    assert torch.equal(gen0, gen4)


def test_read_on_a_cpu_decodes_with_plain_attention_and_training_loads_as_transformers_does(b2b):
    model, _ = load_reader(b2b)
    assert model.decoder.config._attn_implementation == "eager"
    assert model.encoder.config._attn_implementation == "sdpa"
    trained, _ = load_reader(b2b, reading=False)
    assert trained.decoder.config._attn_implementation == "sdpa"


def test_lengths_past_the_position_embeddings_are_refused_by_name_before_reading(b2b):
    """The tiny BERT has 128 positions: an answer or a passage longer than that is named up front
    (a 2,000-token free answer once ended in a tensor-size error deep in BERT)."""
    model, tok = load_reader(b2b)
    examples = [FiDExample("0", "what is the code of bob ?", [], [("people", "bob likes chess .")])]
    for decoding in ("free", "spans"):
        with pytest.raises(InputError, match=r"--max-new-tokens 2000: this reader reads at most 127 answer tokens"):
            generated(model, tok, examples, 1, max_new_tokens=2000, decoding=decoding)
    with pytest.raises(InputError, match=r"--text-maxlength 129: this reader reads at most 128 tokens a passage"):
        generated(model, tok, examples, 1, text_maxlength=129)
    assert len(generated(model, tok, examples, 1, max_new_tokens=127, text_maxlength=128, decoding="free")) == 1


def test_ask_names_a_length_past_the_readers_positions_before_it_searches(b2b):
    """`ask(..., max_new_tokens=2000)` on a warm-started reader: the named error comes before the search
    runs, not after it as a tensor-size error inside BERT."""
    from odqa.reader.args import ReaderSettings
    from odqa.retriever.search_config import SearchConfig
    from odqa.system.args import PipelineParts
    from odqa.system.pipeline import Pipeline

    class Searcher:
        searched = 0

        def with_settings(self, **settings):
            return self

        def search(self, questions, k, unit):
            Searcher.searched += 1
            raise AssertionError("searched")
    pipeline = Pipeline(PipelineParts(), SearchConfig(), ReaderSettings(decoding="free"), "cpu",
                        searcher=Searcher(), reader=load_reader(b2b))
    with pytest.raises(InputError, match="--max-new-tokens 2000: this reader reads at most 127 answer tokens"):
        pipeline.ask("what is the code of bob ?", k=1, max_new_tokens=2000)
    assert Searcher.searched == 0
