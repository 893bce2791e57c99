"""The field's published retrievers, in their published layouts, built here at tiny sizes.

DensePhrases (princeton-nlp/densephrases-*): one directory with a BERT-family `config.json`, the tokenizer's
files and one `pytorch_model.bin` holding `Encoder`'s three LMs (`phrase_encoder.*`,
`query_start_encoder.*`, `query_end_encoder.*`) and `filter_linear` (densephrases/encoder.py). Its first
release named the LMs `bert_start`, `bert_q_start`, `bert_q_end`, and a distilled model carries its
teacher (`cross_encoder.*`, `qa_outputs.*`). Start and end vectors are both the phrase LM's token
state, the question's start and end its two query LMs' [CLS] states, the filter `filter_linear` of the
token state, chunked into a start and an end logit.

DPR (facebook/dpr-question_encoder-single-nq-base, facebook/dpr-ctx_encoder-single-nq-base): transformers'
`DPRQuestionEncoder` and `DPRContextEncoder`, each with its `DPR...Tokenizer` (a BERT vocabulary); a
vector is the [CLS] state, unnormalised; a passage is encoded as the pair (title, text).
"""
import json
import time

import pytest
import torch
from tiny_data import TINY_QUESTIONS, both_sides_copy, write_jsonl
from tiny_models import make_tiny_bert
from transformers import BertConfig, BertModel, BertTokenizer

from odqa.common.io import InputError
from odqa.retriever.phrase_data import encode_passages, encode_questions
from odqa.retriever.phrase_model import DensePhraseModel

PASSAGES = [("alice", "alice was born in paris and moved to rome"), ("bob", "bob was born in oslo in the winter")]
QUESTIONS = ["where was alice born", "where was bob born"]


def densephrases_checkpoint(out, base, hidden=32, first_release=False, teacher=False, drop=()):
    """A DensePhrases `Encoder` as its `save_pretrained` wrote it: the LMs (each from its own seed) and the
    filter in one file, with the BERT config and tokenizer it was made from; old transformers also saved
    each LM's `embeddings.position_ids` buffer."""
    config = BertConfig.from_pretrained(base)
    if hidden != config.hidden_size:
        config = BertConfig(**{**config.to_dict(), "hidden_size": hidden, "intermediate_size": 2 * hidden})
    names = ({"phrase_encoder": "bert_start", "query_start_encoder": "bert_q_start", "query_end_encoder": "bert_q_end"}
             if first_release else {n: n for n in ("phrase_encoder", "query_start_encoder", "query_end_encoder")})
    state, lms = {}, {}
    for seed, (name, saved_as) in enumerate(names.items()):
        torch.manual_seed(seed)
        lms[name] = BertModel(config).eval()
        state.update({f"{saved_as}.{k}": v.clone() for k, v in lms[name].state_dict().items()})
        state[f"{saved_as}.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    torch.manual_seed(9)
    filter_linear = torch.nn.Linear(config.hidden_size, 2)
    state.update({f"filter_linear.{k}": v.clone() for k, v in filter_linear.state_dict().items()})
    if teacher:
        state["qa_outputs.weight"] = torch.zeros(2, config.hidden_size)
        state["cross_encoder.embeddings.word_embeddings.weight"] = torch.zeros(4, config.hidden_size)
    for key in drop:
        del state[key]
    out.mkdir()
    torch.save(state, out / "pytorch_model.bin")
    (out / "config.json").write_text(json.dumps({**config.to_dict(), "architectures": ["Encoder"]}))
    BertTokenizer.from_pretrained(base).save_pretrained(out)
    return out, lms, filter_linear


def densephrases_vectors(lms, filter_linear, passages, questions):
    """densephrases/encoder.py's `embed_phrase`, filter and `embed_query`, written out."""
    with torch.no_grad():
        h = lms["phrase_encoder"](**passages).last_hidden_state
        start, end = h, h
        filter_start, filter_end = filter_linear(start).chunk(2, dim=2)
        q_start = lms["query_start_encoder"](**questions)[0][:, :1, :]
        q_end = lms["query_end_encoder"](**questions)[0][:, :1, :]
    return start, end, filter_start.squeeze(2), filter_end.squeeze(2), q_start[:, 0], q_end[:, 0]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    texts = [f"{t} {p}" for t, p in PASSAGES] + QUESTIONS + [q["question"] for q in TINY_QUESTIONS]
    return make_tiny_bert(tmp_path_factory.mktemp("dp") / "bert", texts)


@pytest.mark.parametrize("hidden, first_release", [(32, False), (48, True)])   # two widths, as base and large
def test_a_densephrases_checkpoint_gives_densephrases_vectors(bert, tmp_path, hidden, first_release):
    path, lms, filter_linear = densephrases_checkpoint(tmp_path / "dp", bert, hidden, first_release=first_release,
                                                       teacher=first_release)
    model = DensePhraseModel.from_pretrained(path).eval()
    from odqa.retriever.lm import load_tokenizer
    tokenizer = load_tokenizer(path)
    passages = encode_passages(tokenizer, [t for t, _ in PASSAGES], [p for _, p in PASSAGES],
                               model.config.max_passage_tokens).batch
    questions = encode_questions(tokenizer, QUESTIONS, model.config.max_question_tokens)
    start, end, f_start, f_end, q_start, q_end = densephrases_vectors(lms, filter_linear, passages, questions)
    with torch.no_grad():
        o_start, o_end, o_filter = model.encode_passages(**passages)
        o_q_start, o_q_end = model.encode_questions(**questions)
    assert model.dim == hidden
    torch.testing.assert_close(o_start, start, rtol=0, atol=0)
    torch.testing.assert_close(o_end, end, rtol=0, atol=0)
    torch.testing.assert_close(o_filter[..., 0], f_start, rtol=0, atol=0)
    torch.testing.assert_close(o_filter[..., 1], f_end, rtol=0, atol=0)
    torch.testing.assert_close(o_q_start, q_start, rtol=0, atol=0)
    torch.testing.assert_close(o_q_end, q_end, rtol=0, atol=0)
    assert (model.config.max_span_len, model.config.max_passage_tokens, model.config.max_question_tokens) == (10, 384, 64)


@pytest.mark.parametrize("drop", ["query_end_encoder.encoder.layer.1.output.dense.weight", "filter_linear.bias"])
def test_a_densephrases_checkpoint_missing_a_weight_is_refused_by_name(bert, tmp_path, drop):
    path, _, _ = densephrases_checkpoint(tmp_path / "dp", bert, drop=(drop,))
    with pytest.raises(InputError, match=rf"missing 1 \({drop}\)"):
        DensePhraseModel.from_pretrained(path)


def test_a_densephrases_checkpoint_with_a_stray_weight_is_refused_by_name(bert, tmp_path):
    path, _, _ = densephrases_checkpoint(tmp_path / "dp", bert)
    state = torch.load(path / "pytorch_model.bin")
    state["span_head.weight"] = torch.zeros(2, 2)
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"unexpected 1 \(span_head.weight\)"):
        DensePhraseModel.from_pretrained(path)


def test_an_encoder_missing_a_weight_is_refused_by_name(bert, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from odqa.retriever.lm import load_lm
    shutil.copytree(bert, tmp_path / "bert")
    state = load_file(tmp_path / "bert" / "model.safetensors")
    del state["encoder.layer.0.attention.self.query.weight"]
    save_file(state, tmp_path / "bert" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"missing 1 \(encoder.layer.0.attention.self.query.weight\)"):
        load_lm(tmp_path / "bert")


def dumped_densephrases(tmp_path, bert):
    """A DensePhrases checkpoint, the tiny corpus dumped by it into TMP/dump (every token kept), and the
    tiny questions: (checkpoint, the --corpus flags, the questions file)."""
    from tiny_data import TINY_DOCS

    from odqa.common.corpus import build_corpus
    from odqa.system.cli import main
    path, _, _ = densephrases_checkpoint(tmp_path / "dp", bert)
    corpus = tmp_path / "corpus"
    build_corpus([write_jsonl(tmp_path / "docs.jsonl", TINY_DOCS)], corpus)
    c = ["--corpus", str(corpus)]
    assert main(["-q", "dump-phrases", "--model", str(path), "--out", str(tmp_path / "dump"), "--threshold=-1e8",
                 *c]) == 0
    return path, c, write_jsonl(tmp_path / "q.jsonl", TINY_QUESTIONS)


def test_every_phrase_command_runs_on_a_densephrases_checkpoint(bert, tmp_path, capsys):
    """dump-phrases (its filter as the dump's), build-index (kept by its filter), train-query, retrieve,
    ask and serve, through the CLI and the server as a user runs them."""
    from tiny_data import TINY_DOCS
    from tiny_models import make_tiny_t5

    from odqa.system.cli import main
    path, c, questions = dumped_densephrases(tmp_path, bert)
    assert main(["-q", "build-index", "--dump", str(tmp_path / "dump"), "--out", str(tmp_path / "index"),
                 "--keep", "0.5", "--model-filter", *c]) == 0
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["dim"] == 32 and manifest["key"]["filter"] == "the phrase model's"
    parts = ["--model", str(path), "--index", str(tmp_path / "index"), *c]
    assert main(["-q", "retrieve", "--retriever", "phrase", *parts, "--questions", str(questions), "--k", "3",
                 "--out", str(tmp_path / "run.json")]) == 0
    entries = json.loads((tmp_path / "run.json").read_text())
    assert len(entries) == len(TINY_QUESTIONS) and all(e["prediction"] and len(e["ctxs"]) == 3 for e in entries)
    assert main(["-q", "train-query", "--model", str(path), "--index", str(tmp_path / "index"), *c,
                 "--questions", str(questions), "--out", str(tmp_path / "tuned"), "--epochs", "1",
                 "--batch-size", "2", "--top-k", "50", "--label", "passage"]) == 0
    tuned = tmp_path / "tuned" / "last"
    from odqa.retriever.phrase_model import phrase_encoder_hash, question_encoder_hash
    assert (tuned / "pytorch_model.bin").is_file() and not (tuned / "phrase_config.json").exists()  # DensePhrases' layout
    assert phrase_encoder_hash(tuned) == phrase_encoder_hash(path) and question_encoder_hash(tuned) != question_encoder_hash(path)
    capsys.readouterr()
    t5 = make_tiny_t5(tmp_path / "t5", [p for d in TINY_DOCS for s in d["sections"] for p in s["paragraphs"]] * 4,
                      vocab_size=300)
    assert main(["ask", TINY_QUESTIONS[0]["question"], "--model", str(tuned), "--index", str(tmp_path / "index"),
                 *c, "--reader", str(t5), "--no-prefilter", "--no-reranker", "--no-memory", "--k", "2"]) == 0
    assert "extractive" in capsys.readouterr().out.lower()
    from fastapi.testclient import TestClient

    from odqa.system.cli import parse_args
    from odqa.system.commands.system import serve_app
    args = parse_args(["serve", "--model", str(path), "--index", str(tmp_path / "index"), *c, "--reader", str(t5),
                       "--no-prefilter", "--no-reranker", "--no-memory"])
    with TestClient(serve_app(args)) as client:
        for _ in range(400):   # the models load in the background
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        reply = client.post("/answer", json={"question": TINY_QUESTIONS[0]["question"], "k": 2})
    assert reply.status_code == 200 and reply.json()["extractive"]["text"]


def test_a_densephrases_dump_and_index_hold_each_vector_once(bert, tmp_path):
    """Its start and end vectors are one: the dump stores one array, the index one side that both
    questions' vectors search, and retrieval is what an index of both copies gives."""
    import numpy as np

    from odqa.system.cli import main
    path, c, questions = dumped_densephrases(tmp_path, bert)
    shard = next((tmp_path / "dump").glob("shard-*"))
    assert json.loads((shard / "done.json").read_text())["shared_sides"] is True
    chunks = sorted(shard.glob("chunk-*.npz"))
    assert chunks and all("end" not in np.load(chunk).files for chunk in chunks)
    both_sides_copy(tmp_path / "dump", tmp_path / "twin")   # as a model of two sides dumps it
    for dump, out in ((tmp_path / "dump", "index"), (tmp_path / "twin", "index2")):
        assert main(["-q", "build-index", "--dump", str(dump), "--out", str(tmp_path / out), "--keep", "1", *c]) == 0
        assert main(["-q", "retrieve", "--retriever", "phrase", "--model", str(path), "--index", str(tmp_path / out),
                     *c, "--questions", str(questions), "--k", "3", "--out", str(tmp_path / f"{out}.json")]) == 0
    once, twice = (json.loads((tmp_path / f"{out}/manifest.json").read_text()) for out in ("index", "index2"))
    assert once["sides"] == ["start"] and twice["sides"] == ["start", "end"]
    assert not (tmp_path / "index" / "end.faiss").exists() and once["bytes_per_passage"] < twice["bytes_per_passage"]
    assert json.loads((tmp_path / "index.json").read_text()) == json.loads((tmp_path / "index2.json").read_text())


def dpr_pair(root, bert):
    from transformers import (
        DPRConfig,
        DPRContextEncoder,
        DPRContextEncoderTokenizer,
        DPRQuestionEncoder,
        DPRQuestionEncoderTokenizer,
    )
    config = DPRConfig(**{k: v for k, v in BertConfig.from_pretrained(bert).to_dict().items()
                          if k in DPRConfig().to_dict() and k not in ("model_type", "architectures")})
    out = {}
    for seed, (side, cls, tok) in enumerate((("question", DPRQuestionEncoder, DPRQuestionEncoderTokenizer),
                                             ("passage", DPRContextEncoder, DPRContextEncoderTokenizer))):
        torch.manual_seed(seed)
        out[side] = root / f"dpr-{side}"
        cls(config).save_pretrained(out[side])
        tok(vocab_file=str(bert / "vocab.txt")).save_pretrained(out[side])
    return out


def test_dpr_encoders_retrieve_by_the_inner_product_of_their_cls_vectors(bert, tmp_path, capsys):
    from tiny_data import TINY_DOCS
    from transformers import AutoTokenizer, DPRContextEncoder, DPRQuestionEncoder

    from odqa.common.corpus import PassageStore, build_corpus
    from odqa.system.cli import main
    dpr = dpr_pair(tmp_path, bert)
    corpus = tmp_path / "corpus"
    build_corpus([write_jsonl(tmp_path / "docs.jsonl", TINY_DOCS)], corpus)
    questions = write_jsonl(tmp_path / "q.jsonl", TINY_QUESTIONS)
    retrieve = ["-q", "retrieve", "--retriever", "dense", "--questions", str(questions), "--corpus", str(corpus),
                "--k", "4", "--out", str(tmp_path / "run.json")]
    assert main([*retrieve, "--model", str(dpr["question"]), "--passage-model", str(dpr["passage"])]) == 0
    found = json.loads((tmp_path / "run.json").read_text())
    # DPR's scoring, written out: [CLS] of each side, the passage as (title, text), raw inner product
    store = PassageStore(corpus)
    passages = [store[i] for i in range(len(store))]
    with torch.no_grad():
        q_tok, p_tok = AutoTokenizer.from_pretrained(dpr["question"]), AutoTokenizer.from_pretrained(dpr["passage"])
        q = DPRQuestionEncoder.from_pretrained(dpr["question"]).eval()(
            **q_tok([x["question"] for x in TINY_QUESTIONS], padding=True, return_tensors="pt")).pooler_output
        p = DPRContextEncoder.from_pretrained(dpr["passage"]).eval()(
            **p_tok([x["title"] for x in passages], [x["text"] for x in passages], padding=True,
                    return_tensors="pt")).pooler_output
    scores = q @ p.T
    for entry, row in zip(found, scores):
        best = torch.topk(row, 4)
        assert [c["id"] for c in entry["ctxs"]] == [passages[i]["id"] for i in best.indices.tolist()]
        assert [c["score"] for c in entry["ctxs"]] == pytest.approx(best.values.tolist(), rel=1e-4, abs=1e-4)
    assert row.norm() != pytest.approx(1.0)   # not normalised
    # a context encoder given as the question encoder is refused, never loaded at random
    assert main([*retrieve, "--model", str(dpr["passage"]), "--passage-model", str(dpr["passage"])]) == 2
    assert "missing" in capsys.readouterr().err
    assert main([*retrieve, "--passage-model", str(dpr["passage"])]) == 2
    assert "--model names its question encoder" in capsys.readouterr().err
