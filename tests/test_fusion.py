"""`--decoding phrases` (reader/fusion.py) on a tiny warm-started reader made in the test: the answer is
the spans answer or a passage's best phrase; the cached likelihood is the plain forward's; the choice
is the best candidate by the documented score; files without phrases are refused by name."""
import json

import pytest
import torch
from reader_checks import generated
from tiny_data import CODE_NAMES, HOBBIES, code_world
from tiny_models import make_tiny_bert

from odqa.common.io import InputError
from odqa.common.metrics.answers import normalize_answer
from odqa.reader import fusion
from odqa.reader.args import ReaderInitArgs, ReaderSettings
from odqa.reader.fid import FusedEncoderOutput
from odqa.reader.fid_data import FiDCollator, FiDExample, load_fid_file, strip_article
from odqa.reader.read import load_reader, read
from odqa.reader.warm_start import init_warm_reader

TEXTS = ([f"the code of {n} is {d} ." for n in CODE_NAMES for d in range(10)]
         + [f"question: what is the code of {n} ? title: people context: {n} likes {h} ." for n in CODE_NAMES for h in HOBBIES])


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    root = tmp_path_factory.mktemp("fusion")
    bert = make_tiny_bert(root / "bert", TEXTS, hidden=64, layers=2)
    init_warm_reader(bert, root / "init", ReaderInitArgs(decoder_layers=2, pointer=True, passage_prior=True))
    model, tok = load_reader(root / "init")
    with torch.no_grad():                 # an untrained reader whose passage prior is not uniform
        model.passage_scorer.weight.normal_(0, 1.0)
    return model, tok


def _examples(n: int = 12, k: int = 4) -> list[FiDExample]:
    """code_world's questions, each passage's 'best phrase' a word of it with a random score."""
    g = torch.Generator().manual_seed(0)
    out = []
    for w in code_world(n, k, 3):
        phrases = []
        for c in w["ctxs"]:
            words = c["text"].split()[:-1]
            phrases.append((words[int(torch.randint(len(words), (1,), generator=g))], float(torch.randn(1, generator=g) * 3)))
        out.append(FiDExample(w["id"], w["question"], w["answers"], [(c["title"], c["text"]) for c in w["ctxs"]],
                              phrases=phrases))
    return out


def _encoded(model, tok, examples):
    """(input_ids, mask (B, k, L), the fused encoder output) of the examples' 4 passages."""
    batch = FiDCollator(tok, 4, 32).encode_passages(examples)
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      return_dict=True)
    return batch["input_ids"], batch["attention_mask"], encoded


def _read(model, tok, examples, decoding, k=4):
    return generated(model, tok, examples, k, batch_size=4, text_maxlength=32, max_new_tokens=4, decoding=decoding,
                     dtype=torch.float32)


def test_the_answer_is_the_spans_answer_or_a_passage_phrase(reader):
    model, tok = reader
    examples = _examples()
    spans, phrases = _read(model, tok, examples, "spans"), _read(model, tok, examples, "phrases")
    for ex, s, p in zip(examples, spans, phrases):
        assert p == s or p in [text for text, _ in ex.phrases], (p, s, ex.phrases)
    assert any(p != s for s, p in zip(spans, phrases))      # the choice is not always the greedy answer


def test_the_cached_likelihood_is_the_plain_forward_s(reader):
    """The decoder run once at the start token, its cache copied to each candidate, gives each candidate's
    per-token log-likelihood as one teacher-forced forward over the passages does."""
    model, tok = reader
    ids, mask, encoded = _encoded(model, tok, _examples(3))
    b, k, length = ids.shape
    rows, texts = [0, 0, 1, 2, 2, 2], ["bob", "the code of", "7", "likes", "is 3", "people"]
    cached = fusion._per_token_log_likelihood(model, tok, encoded, mask.reshape(b, k * length), rows, texts, 32)
    labels = FiDCollator(tok, 4, 32).encode_targets([strip_article(t) for t in texts])   # as training's targets
    with torch.no_grad():
        logits = model(input_ids=ids[rows], attention_mask=mask[rows], labels=labels).logits.float()
    lp = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
    present = labels != -100
    plain = (lp * present).sum(-1) / present.sum(-1)
    assert torch.allclose(cached, plain, atol=1e-4), (cached, plain)


@pytest.mark.parametrize("weight", [0.0, 0.5, 1000.0])
def test_the_choice_is_the_best_candidate_by_likelihood_and_phrase_score(reader, monkeypatch, weight):
    model, tok = reader
    monkeypatch.setattr(fusion, "WEIGHT", weight)
    examples = _examples()
    spans, phrases = _read(model, tok, examples, "spans"), _read(model, tok, examples, "phrases")
    batch = FiDCollator(tok, 4, 32).encode_passages(examples)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    for r, (ex, s, chosen) in enumerate(zip(examples, spans, phrases)):
        cands = fusion.candidates(ex, s, 4)
        labels = FiDCollator(tok, 4, 32).encode_targets([strip_article(t) for t, _ in cands])
        n = len(cands)
        with torch.no_grad():
            logits = model(input_ids=ids[r:r + 1].expand(n, -1, -1), attention_mask=mask[r:r + 1].expand(n, -1, -1),
                           labels=labels).logits.float()
        lp = torch.log_softmax(logits, -1).gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
        present = labels != -100
        score = (lp * present).sum(-1) / present.sum(-1) + weight * torch.tensor(
            [fusion.FLOOR if term is None else term for _, term in cands])
        assert normalize_answer(chosen) == normalize_answer(cands[int(score.argmax())][0])
        if weight == 1000.0:      # the phrase term decides: the best-scored phrase
            assert chosen == max(ex.phrases, key=lambda p: p[1])[0]


def test_candidates_are_distinct_and_the_phrase_term_a_log_softmax():
    ex = FiDExample("q", "who?", [], [("", "a")] * 5,
                    phrases=[("The Beatles", 4.0), ("beatles", 2.0), ("the", 9.0), None, ("Elvis", 0.0)])
    cands = fusion.candidates(ex, "Elvis Presley", 5)
    assert [t for t, _ in cands] == ["The Beatles", "Elvis", "Elvis Presley"]
    terms = torch.tensor([4.0, 2.0, 0.0]) / fusion.TEMPERATURE
    norm = torch.logsumexp(terms, 0)
    assert cands[0][1] == pytest.approx(float(terms[0] - norm)) and cands[1][1] == pytest.approx(float(terms[2] - norm))
    assert cands[2][1] is None
    assert [t for t, _ in fusion.candidates(ex, "the beatles", 5)] == ["The Beatles", "Elvis"]


def test_phrase_decoding_refuses_passages_without_phrases_by_name(reader, tmp_path):
    model, tok = reader
    rows = code_world(3, 2, 0)
    path = tmp_path / "bm25.json"
    path.write_text(json.dumps(rows))
    with pytest.raises(InputError, match="decoding 'phrases'.*'q0'"):
        _read(model, tok, load_fid_file(path), "phrases", k=2)
    with pytest.raises(InputError, match=r"'q0' of \S*bm25.json has none"):
        read(model, tok, path, {2: tmp_path / "pred.jsonl"}, ReaderSettings(decoding="phrases"))
    assert not (tmp_path / "pred.jsonl").exists()
    rows[0]["ctxs"][0]["phrase"] = {"score": 1.0}
    path.write_text(json.dumps(rows))
    with pytest.raises(InputError, match=r"bm25.json:0: ctx \d: \"phrase\" needs a \"text\""):
        load_fid_file(path)
    rows[0]["ctxs"][0]["phrase"] = {"text": "bob", "score": "high"}
    path.write_text(json.dumps(rows))
    with pytest.raises(InputError, match="phrase: \"score\" is not a number"):
        load_fid_file(path)


def test_phrases_follow_their_passages_into_score_order(tmp_path):
    row = {"id": "q", "question": "who?", "answers": ["x"], "ctxs": [
        {"title": "a", "text": "one", "score": 1.0, "phrase": {"text": "one", "score": 5.0}},
        {"title": "b", "text": "two", "score": 3.0},
        {"title": "c", "text": "three", "score": 2.0, "phrase": {"text": "three", "score": 7.0}}]}
    path = tmp_path / "f.jsonl"
    path.write_text(json.dumps(row) + "\n")
    ex, = load_fid_file(path)
    assert ex.passages == [("b", "two"), ("c", "three"), ("a", "one")]
    assert ex.phrases == [None, ("three", 7.0), ("one", 5.0)]


def test_choosing_over_a_batch_equals_choosing_row_by_row(reader):
    """choose() over a batch equals choose() row by row: no row reads another's passages."""
    model, tok = reader
    examples = _examples(4)
    ids, mask, encoded = _encoded(model, tok, examples)
    b, k, length = ids.shape
    generated = ["bob"] * b
    together = fusion.choose(model, tok, encoded, mask.reshape(b, -1), examples, generated, k)
    for r in range(b):
        one = FusedEncoderOutput(last_hidden_state=encoded.last_hidden_state[r:r + 1],
                                 input_ids=encoded.input_ids[r:r + 1], passage_length=length)
        assert fusion.choose(model, tok, one, mask[r:r + 1].reshape(1, -1), examples[r:r + 1], generated[r:r + 1], k) \
            == together[r:r + 1]
