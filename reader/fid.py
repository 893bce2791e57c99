"""Fusion-in-Decoder (Izacard & Grave, "Leveraging Passage Retrieval with Generative Models for Open
Domain Question Answering") over two kinds of Hugging Face encoder-decoder:

- `FiDT5`, a T5ForConditionalGeneration: t5-base, flan-t5, or `odqa reader init --preset`;
- `FiDEncoderDecoder`, an EncoderDecoderModel of a BERT-family encoder and a BERT decoder with
  cross-attention, warm-started from one pretrained encoder (`odqa reader init --from`, reader/warm_start.py).

The whole idea: encode each of the k passages (with the question) on its own, so the encoder's cost
grows linearly in k rather than quadratically; then concatenate the k encoder outputs, so the decoder
cross-attends over all k x L tokens at once and fuses evidence from several passages.

`input_ids` and `attention_mask` are (B, k, L). A 2-D input is the plain model, so FiD with k = 1 is
the model it wraps. (`generate()` insists on a 2-D mask, so there the passages travel flattened to
(B, k * L) with `passage_length=L` beside them, and the encoder splits them again.) The subclasses add
no weights: a checkpoint of the wrapped class loads with `from_pretrained`. A trained FiDT5 saves as a
plain T5 checkpoint; a FiDEncoderDecoder saves its tied embedding once, so it loads back through
`FiDEncoderDecoder.from_pretrained` (reader.read.load_reader picks the class from the config).
"""
from __future__ import annotations

import re
import warnings

import torch
from transformers import EncoderDecoderModel, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput


class FusedEncoder:
    """What `get_encoder()` hands to `generate()`: the encoder applied passage by passage, its outputs
    joined to (B, k * L, d). Not an nn.Module, so it owns no parameters and changes no state-dict key."""

    def __init__(self, encoder: torch.nn.Module):
        self.encoder = encoder
        self.main_input_name = "input_ids"

    def __call__(self, *args, **kwargs) -> BaseModelOutput:
        return self.forward(*args, **kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                passage_length: int | None = None, **kwargs) -> BaseModelOutput:
        if input_ids.dim() == 2 and passage_length is None:
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        if input_ids.dim() == 2:
            input_ids = input_ids.reshape(input_ids.size(0), -1, passage_length)
        b, k, length = input_ids.shape
        if attention_mask is not None:
            attention_mask = attention_mask.reshape(b * k, length)
        out = self.encoder(input_ids=input_ids.reshape(b * k, length), attention_mask=attention_mask, **kwargs)
        out.last_hidden_state = out.last_hidden_state.reshape(b, k * length, -1)
        return out


class FiD:
    """The FiD behaviour, mixed in front of an encoder-decoder class that has `self.encoder`."""

    def get_encoder(self, modality: str | None = None):
        return FusedEncoder(self.encoder)

    def forward(self, input_ids=None, attention_mask=None, encoder_outputs=None, passage_length=None,
                label_allowed=None, **kwargs):
        """`label_allowed` (B, T, A), token ids padded with -1: the loss at target step t is a softmax over
        those tokens alone (what span-constrained decoding may choose there); a row of -1 leaves the
        step unconstrained."""
        if encoder_outputs is None and input_ids is not None:
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                                 passage_length=passage_length, return_dict=True)
        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = attention_mask.flatten(1)   # the decoder's cross-attention mask over k * L tokens
        if label_allowed is None or kwargs.get("labels") is None:
            return super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs, **kwargs)
        labels = kwargs.pop("labels")
        kwargs["decoder_input_ids"] = self.prepare_decoder_input_ids_from_labels(labels)
        out = super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs, **kwargs)
        vocab = out.logits.size(-1)
        index = torch.where(label_allowed < 0, vocab, label_allowed)      # -1 -> a column dropped below
        allowed = torch.zeros(*out.logits.shape[:-1], vocab + 1, dtype=torch.bool, device=out.logits.device)
        allowed = allowed.scatter_(-1, index, True)[..., :vocab] | (label_allowed < 0).all(-1, keepdim=True)
        logits = out.logits.masked_fill(~allowed, torch.finfo(out.logits.dtype).min)
        out.loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out

    @torch.no_grad()
    def generate(self, input_ids=None, attention_mask=None, **kwargs):
        if input_ids is not None and input_ids.dim() == 3:
            b, k, length = input_ids.shape
            kwargs["passage_length"] = length
            input_ids = input_ids.reshape(b, k * length)
            attention_mask = attention_mask.reshape(b, k * length) if attention_mask is not None else None
        return super().generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    def encoder_gradient_checkpointing(self) -> None:
        """Recompute the encoder blocks in the backward pass: the k x L encoder activations are what
        grows with k, the decoder's are small."""
        self.encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def new_parameters(self) -> set[str]:
        """Names of the weights that did not come from a pretrained model (a warm start's new parts);
        `train-reader --new-lr` trains them at their own rate."""
        return set()


class FiDT5(FiD, T5ForConditionalGeneration):
    pass


class FiDEncoderDecoder(FiD, EncoderDecoderModel):
    """bert2bert (Rothe, Narayan & Severyn, TACL 2020) read FiD-style. The encoder's word embeddings are
    also the decoder's input and output embeddings: the tie is declared here, so `save_pretrained`
    writes the tensor once and `from_pretrained` ties it again (config.tie_word_embeddings)."""

    _tied_weights_keys = {"decoder.bert.embeddings.word_embeddings.weight": "encoder.embeddings.word_embeddings.weight"}
    # What the warm start makes anew: cross-attention (initialised from self-attention, but learning
    # a new job) and the LM head's transform and bias.
    NEW = re.compile(r"\.crossattention\.|^decoder\.cls\.predictions\.(transform\.|bias$)")

    def forward(self, input_ids=None, attention_mask=None, encoder_outputs=None, passage_length=None,
                label_allowed=None, **kwargs):
        with warnings.catch_warnings():
            # EncoderDecoderModel warns on every call with labels that it computes the loss itself (since 4.12).
            warnings.filterwarnings("ignore", category=FutureWarning, message="Version v4.12.0")
            return super().forward(input_ids, attention_mask, encoder_outputs, passage_length, label_allowed, **kwargs)

    def new_parameters(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if self.NEW.search(name)}


def reader_class(model_type: str):
    """The FiD class for a checkpoint's `config.model_type`, or None."""
    return {"t5": FiDT5, "encoder-decoder": FiDEncoderDecoder}.get(model_type)
