"""Tiny encoders built inside the tests (no hub): a 2-layer BERT whose vocabulary is the words of
the texts it will see."""
import re
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizer

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def make_tiny_bert(out: Path, texts: list[str], hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    words = sorted({w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower())})
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    tokenizer = BertTokenizer(vocab=vocab)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=128)
    BertModel(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def make_tiny_t5(out: Path, texts: list[str], vocab_size: int = 160, d_model: int = 32, layers: int = 2,
                 seed: int = 0) -> Path:
    """A 2-layer T5 with a SentencePiece vocabulary trained on `texts`, saved as an HF checkpoint."""
    from transformers import T5Config

    from odqa.reader.fid import FiDT5
    from odqa.reader.t5_init import train_tokenizer
    tokenizer = train_tokenizer(texts, out, vocab_size)
    torch.manual_seed(seed)
    config = T5Config(vocab_size=len(tokenizer), d_model=d_model, d_ff=2 * d_model, num_layers=layers,
                      num_decoder_layers=layers, num_heads=2, d_kv=d_model // 2, dropout_rate=0.0,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    FiDT5(config).save_pretrained(out)
    return out


def make_tiny_system(root: Path) -> dict:
    """The tiny corpus (tiny_data's documents), an untrained phrase model over a tiny BERT, its dump
    and index, and a tiny T5 reader, under `root`: what the system's commands run on."""
    from search_helpers import index_of
    from tiny_data import TINY_DOCS, TINY_QUESTIONS, write_jsonl

    from odqa.common.corpus import PassageStore, build_corpus
    from odqa.retriever.args import PhraseModelConfig
    from odqa.retriever.lm import load_tokenizer
    from odqa.retriever.phrase_dump import dump_phrases
    from odqa.retriever.phrase_model import DensePhraseModel
    corpus = root / "corpus"
    build_corpus([write_jsonl(root / "docs.jsonl", TINY_DOCS)], corpus)
    texts = [p["title"] + " " + p["text"] for p in PassageStore(corpus)] + [q["question"] for q in TINY_QUESTIONS]
    bert = make_tiny_bert(root / "bert", texts)
    DensePhraseModel(PhraseModelConfig(encoder=str(bert), max_passage_tokens=64)).save_pretrained(root / "phrase",
                                                                                       load_tokenizer(bert))
    dump_phrases(root / "phrase", corpus, root / "dump")
    index_of(root / "dump", root / "index", corpus)
    make_tiny_t5(root / "t5", texts * 4, vocab_size=300)
    return {"root": root, "corpus": corpus, "bert": bert, "phrase": root / "phrase", "index": root / "index",
            "t5": root / "t5"}
