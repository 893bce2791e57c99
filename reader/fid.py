"""Fusion-in-Decoder (Izacard & Grave, "Leveraging Passage Retrieval with Generative Models for Open
Domain Question Answering") as a subclass of transformers' T5ForConditionalGeneration.

The whole idea: encode each of the k passages (with the question) on its own, so the encoder's cost
grows linearly in k rather than quadratically; then concatenate the k encoder outputs, so the decoder
cross-attends over all k x L tokens at once and fuses evidence from several passages.

`input_ids` and `attention_mask` are (B, k, L). A 2-D input is plain T5, so FiD with k = 1 is T5.
(`generate()` insists on a 2-D mask, so there the passages travel flattened to (B, k * L) with
`passage_length=L` beside them, and the encoder splits them again.) The
subclass adds no weights: any T5 checkpoint loads into FiDT5 with `from_pretrained`, and a trained FiDT5
saves as a plain T5 checkpoint that `T5ForConditionalGeneration.from_pretrained` reads back.
"""
from __future__ import annotations

import torch
from transformers import T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput


class FusedEncoder:
    """What `get_encoder()` hands to `generate()`: T5's encoder applied passage by passage, its outputs
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


class FiDT5(T5ForConditionalGeneration):

    def get_encoder(self, modality: str | None = None):
        return FusedEncoder(self.encoder)

    def forward(self, input_ids=None, attention_mask=None, encoder_outputs=None, passage_length=None, **kwargs):
        if encoder_outputs is None and input_ids is not None:
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                                 passage_length=passage_length, return_dict=True)
        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = attention_mask.flatten(1)   # the decoder's cross-attention mask over k * L tokens
        return super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs, **kwargs)

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
