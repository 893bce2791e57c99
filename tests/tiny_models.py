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
