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
(B, k * L) with `passage_length=L` beside them, and the encoder splits them again.) FiD itself adds
no weights: a checkpoint of the wrapped class loads with `from_pretrained`; the one optional addition,
the warm-started reader's passage prior (a linear layer, `config.passage_prior`), starts as the
uniform prior when a checkpoint lacks it. A trained FiDT5 saves as a
plain T5 checkpoint; a FiDEncoderDecoder saves its tied embedding once, so it loads back through
`FiDEncoderDecoder.from_pretrained` (reader.read.load_reader picks the class from the config).
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass

import torch
from transformers import EncoderDecoderModel, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput


@dataclass
class FusedEncoderOutput(BaseModelOutput):
    """The encoder's output with the token ids it encoded, (B, k * L), and the passage length L: a
    pointer scores those tokens (and a passage prior weighs their passages) at every decoding step,
    when `generate()` hands the model only this output."""
    input_ids: torch.LongTensor | None = None
    passage_length: int | None = None


class FusedEncoder:
    """What `get_encoder()` hands to `generate()`: the encoder applied passage by passage, its outputs
    joined to (B, k * L, d). Not an nn.Module, so it owns no parameters and changes no state-dict key.

    The B x k passages are padded to the longest of them, and a quarter of a retrieved batch's tokens
    are padding. So with `bucket` tokens the passages are encoded in groups of like length, each group
    padded only to its longest rounded up to a multiple of `bucket`: a real token's state is the same
    (attention never looks at padding), padding past a group's width gets zeros (every reader of padding
    masks it), and a training step on retrieved passages runs 1.17x faster, reading 1.3x
    (docs/notes/reader.md). 0: one padded call."""

    def __init__(self, encoder: torch.nn.Module, bucket: int = 0):
        self.encoder = encoder
        self.bucket = bucket
        self.main_input_name = "input_ids"

    def __call__(self, *args, **kwargs) -> BaseModelOutput:
        return self.forward(*args, **kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                passage_length: int | None = None, **kwargs) -> BaseModelOutput:
        if input_ids.dim() == 2 and passage_length is None:
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
            return FusedEncoderOutput(out.last_hidden_state, out.hidden_states, out.attentions, input_ids,
                                      input_ids.size(1))
        if input_ids.dim() == 2:
            input_ids = input_ids.reshape(input_ids.size(0), -1, passage_length)
        b, k, length = input_ids.shape
        if attention_mask is not None:
            attention_mask = attention_mask.reshape(b * k, length)
        flat_ids = input_ids.reshape(b * k, length)
        if self.bucket and attention_mask is not None and not (kwargs.get("output_hidden_states")
                                                                or kwargs.get("output_attentions")):
            states = self.by_length(flat_ids, attention_mask, **kwargs)
            return FusedEncoderOutput(states.reshape(b, k * length, -1), input_ids=flat_ids.reshape(b, k * length),
                                      passage_length=length)
        out = self.encoder(input_ids=flat_ids, attention_mask=attention_mask, **kwargs)
        return FusedEncoderOutput(out.last_hidden_state.reshape(b, k * length, -1), out.hidden_states, out.attentions,
                                  flat_ids.reshape(b, k * length), length)

    def by_length(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs) -> torch.Tensor:
        """(N, L, d) states of N passages encoded in groups of like length (see the class)."""
        length = input_ids.size(1)
        positions = torch.arange(1, length + 1, device=input_ids.device)
        ends = ((attention_mask > 0) * positions).amax(-1)                  # last attended token + 1; 0: absent
        widths = ((ends + self.bucket - 1) // self.bucket * self.bucket).clamp(max=length)
        rows, pieces = [], []
        for width in widths.unique().tolist():
            if width == 0:
                continue
            index = (widths == width).nonzero().squeeze(1)
            states = self.encoder(input_ids=input_ids[index, :width], attention_mask=attention_mask[index, :width],
                                  **kwargs).last_hidden_state
            rows.append(index)
            pieces.append(torch.nn.functional.pad(states, (0, 0, 0, length - width)))
        absent = (widths == 0).nonzero().squeeze(1)
        if not pieces:      # no passage at all: the encoder's own output, as without buckets
            return self.encoder(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state
        if len(absent):
            rows.append(absent)
            pieces.append(pieces[0].new_zeros(len(absent), length, pieces[0].size(-1)))
        order = torch.cat(rows).argsort()
        return torch.cat(pieces)[order]


class FiD:
    """The FiD behaviour, mixed in front of an encoder-decoder class that has `self.encoder`."""

    # FusedEncoder's length groups, in tokens (0: the k passages in one padded call)
    encoder_bucket = 32

    def get_encoder(self, modality: str | None = None):
        return FusedEncoder(self.encoder, self.encoder_bucket)

    pointing = False   # see FiDEncoderDecoder

    def forward(self, input_ids=None, attention_mask=None, encoder_outputs=None, passage_length=None,
                label_allowed=None, labels=None, passage_labels=None, **kwargs):
        """`label_allowed` (B, T, A), token ids padded with -1: the loss at target step t is a softmax over
        those tokens alone (what span-constrained decoding may choose there); a row of -1 leaves the
        step unconstrained. `passage_labels` (B, k), 1 where a passage holds an answer: a model with a
        passage prior adds its loss (`passage_loss`); others ignore them."""
        if encoder_outputs is None and input_ids is not None:
            encoder_outputs = self.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                                 passage_length=passage_length, return_dict=True)
        if attention_mask is not None and attention_mask.dim() == 3:
            attention_mask = attention_mask.flatten(1)   # the decoder's cross-attention mask over k * L tokens
        if not self.pointing and label_allowed is None:
            return super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs, labels=labels,
                                   **kwargs)
        if labels is not None:
            kwargs["decoder_input_ids"] = self.prepare_decoder_input_ids_from_labels(labels)
        if self.pointing:
            if not kwargs.get("output_hidden_states"):
                kwargs.pop("output_hidden_states", None)   # it would override the decoder's flag below
            kwargs["decoder_output_hidden_states"] = True
        out = super().forward(attention_mask=attention_mask, encoder_outputs=encoder_outputs, **kwargs)
        if self.pointing:
            out.logits = self.point(out, encoder_outputs, attention_mask)
        if labels is None:
            return out
        logits = out.logits
        if label_allowed is not None:
            vocab = logits.size(-1)
            index = torch.where(label_allowed < 0, vocab, label_allowed)      # -1 -> a column dropped below
            allowed = torch.zeros(*logits.shape[:-1], vocab + 1, dtype=torch.bool, device=logits.device)
            allowed = allowed.scatter_(-1, index, True)[..., :vocab] | (label_allowed < 0).all(-1, keepdim=True)
            logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
        out.loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        if passage_labels is not None:
            extra = self.passage_loss(encoder_outputs, attention_mask, passage_labels)
            out.loss = out.loss if extra is None else out.loss + extra
        return out

    def passage_loss(self, encoder_outputs, attention_mask, passage_labels):
        return None

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

    def freeze_encoder_bottom(self, embeddings: bool, layers: int) -> None:
        """Hold the embeddings (the shared word embeddings are the decoder's input ones too, and the LM
        head's where it is tied) and the encoder's bottom `layers` blocks fixed (`encoder_parts`, each
        kind's own). Autograd computes nothing below the lowest weight that trains, so with the
        embeddings and n blocks fixed the backward pass stops n blocks up: on a CPU the embedding
        matrix's dense gradient and AdamW update are a fifth of a warm reader's FiD step (docs/notes/reader.md)."""
        modules, blocks = self.encoder_parts()
        if not 0 <= layers <= len(blocks):
            raise ValueError(f"freeze_layers must be between 0 and the encoder's {len(blocks)} blocks, not {layers}")
        for module in ([modules] if embeddings else []) + list(blocks[:layers]):
            for p in module.parameters():
                p.requires_grad_(False)

    def new_parameters(self) -> set[str]:
        """Names of the weights that did not come from a pretrained model (a warm start's new parts);
        `train-reader --new-lr` trains them at their own rate."""
        return set()


class FiDT5(FiD, T5ForConditionalGeneration):
    def encoder_parts(self) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
        """(the embeddings, the encoder's blocks in order)."""
        return self.shared, self.encoder.block


class FiDEncoderDecoder(FiD, EncoderDecoderModel):
    """bert2bert (Rothe, Narayan & Severyn, TACL 2020) read FiD-style. The encoder's word embeddings are
    also the decoder's input and output embeddings: the tie is declared here, so `save_pretrained`
    writes the tensor once and `from_pretrained` ties it again (config.tie_word_embeddings)."""

    _tied_weights_keys = {"decoder.bert.embeddings.word_embeddings.weight": "encoder.embeddings.word_embeddings.weight"}
    # What the warm start makes anew: cross-attention (initialised from self-attention, but learning
    # a new job), the LM head's transform and bias, and the passage scorer.
    NEW = re.compile(r"\.crossattention\.|^decoder\.cls\.predictions\.(transform\.|bias$)|^passage_scorer\.")

    def __init__(self, config=None, encoder=None, decoder=None):
        super().__init__(config, encoder, decoder)
        if self.has_passage_prior:
            self.passage_scorer = torch.nn.Linear(self.config.encoder.hidden_size, 1)
            self._zero_passage_scorer()

    def encoder_parts(self) -> tuple[torch.nn.Module, torch.nn.ModuleList]:
        return self.encoder.embeddings, self.encoder.encoder.layer

    def _zero_passage_scorer(self) -> None:
        # A zero scorer is the uniform prior: a reader switched to it reads exactly as before.
        torch.nn.init.zeros_(self.passage_scorer.weight)
        torch.nn.init.zeros_(self.passage_scorer.bias)

    def _init_weights(self, module):
        if getattr(self, "passage_scorer", None) is module:
            self._zero_passage_scorer()
        else:
            super()._init_weights(module)

    @property
    def has_passage_prior(self) -> bool:
        """`config.passage_prior` (`odqa reader init --passage-prior`): with the pointer, each passage's
        tokens are weighed by p(passage), a softmax over the passages of a linear score of each one's
        first ([CLS]) encoder state, which has read the question beside the passage: a cross-encoder's
        relevance, as DPR's reader selects a passage before its span. It learns from the answer's
        likelihood and from the retrieval file's has_answer labels (`passage_loss`)."""
        return bool(getattr(self.config, "passage_prior", False))

    def passage_scores(self, encoder_outputs: FusedEncoderOutput, attention_mask: torch.Tensor | None):
        """(scores (B, k), present (B, k)) of the passage scorer, absent passages at -1e9; None without one."""
        if not self.has_passage_prior:
            return None
        states, length = encoder_outputs.last_hidden_state, encoder_outputs.passage_length
        if length is None:
            raise ValueError("a passage prior needs the encoder output's passage_length (FusedEncoderOutput)")
        b, k = states.size(0), states.size(1) // length
        first = states.view(b, k, length, -1)[:, :, 0]
        present = (attention_mask.view(b, k, length)[:, :, 0] > 0 if attention_mask is not None
                   else torch.ones(b, k, dtype=torch.bool, device=states.device))
        # -1e9, not -inf: a question without passages must not turn the softmax into NaN.
        return self.passage_scorer(first).squeeze(-1).float().masked_fill(~present, -1e9), present

    def passage_log_prior(self, encoder_outputs, attention_mask) -> torch.Tensor | None:
        """log(n * p(passage)) (B, k) for the n present passages: 0 everywhere under a uniform prior, so
        the pointer's mass against the vocabulary's is what it was without one."""
        scored = self.passage_scores(encoder_outputs, attention_mask)
        if scored is None:
            return None
        scores, present = scored
        n = present.sum(-1, keepdim=True).clamp_min(1)
        prior = torch.log_softmax(scores, -1) + n.log()
        return torch.where(present, prior, 0.0).to(encoder_outputs.last_hidden_state.dtype)

    def passage_loss(self, encoder_outputs, attention_mask, passage_labels):
        """-log p(an answer-bearing passage), over the questions whose present passages hold both kinds."""
        scored = self.passage_scores(encoder_outputs, attention_mask)
        if scored is None:
            return None
        scores, present = scored
        positive = (passage_labels > 0) & present
        rows = positive.any(-1) & (present & ~positive).any(-1)
        if not rows.any():
            return scores.sum() * 0.0     # keeps the scorer in the graph, which ZeRO's hooks expect
        log_p = torch.log_softmax(scores, -1)
        loss = -torch.logsumexp(log_p.masked_fill(~positive, -1e9), -1)[rows].mean()
        return self.passage_loss_coef * loss

    @property
    def passage_loss_coef(self) -> float:
        """The passage loss's weight beside the answer's (`config.passage_loss_coef`, as Mixtral's
        `router_aux_loss_coef`; `train-reader --passage-loss-coef` sets it); 1 when the config has none."""
        return float(getattr(self.config, "passage_loss_coef", 1.0))

    @property
    def pointing(self) -> bool:
        """`config.pointer` (`odqa reader init --pointer`): the output distribution mixes the vocabulary's
        with a pointer over the passages' tokens (See et al. 2017's copy, without the gate). A token's
        pointer score is the decoder state against the token's encoder state, which knows its passage
        and the question; the tied vocabulary row of "2006" is the same in every passage. It adds no
        weights, so a trained reader can be switched to it."""
        return bool(getattr(self.config, "pointer", False))

    def point(self, out, encoder_outputs: FusedEncoderOutput, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """logits (B, T, V) -> log(exp(logits) + sum over source positions s holding v of exp(score[s])),
        each score shifted by its passage's log prior where the model has one."""
        source_ids = encoder_outputs.input_ids
        query = self.decoder.cls.predictions.transform(out.decoder_hidden_states[-1])          # (B, T, d)
        # in float32 under autocast too: the scatter-add of exp(scores) must match the logits' dtype
        scores = torch.einsum("btd,bsd->bts", query, out.encoder_last_hidden_state).float() / math.sqrt(query.size(-1))
        prior = self.passage_log_prior(encoder_outputs, attention_mask)
        if prior is not None:
            scores = scores + prior.repeat_interleave(encoder_outputs.passage_length, dim=1)[:, None, :]
        if attention_mask is not None:
            scores = scores.masked_fill(attention_mask[:, None, :] == 0, float("-inf"))
        top = scores.amax(-1, keepdim=True).clamp_min(-1e4)
        mass = torch.zeros_like(out.logits, dtype=scores.dtype).scatter_add_(
            -1, source_ids[:, None, :].expand_as(scores), (scores - top).exp())
        # log(0) only where no source token is: there the pointer adds nothing (and no NaN gradient).
        pointer = torch.where(mass > 0, mass.clamp_min(torch.finfo(mass.dtype).tiny).log(), float("-inf")) + top
        return torch.logaddexp(out.logits.float(), pointer)

    def forward(self, input_ids=None, attention_mask=None, encoder_outputs=None, passage_length=None,
                label_allowed=None, labels=None, passage_labels=None, **kwargs):
        with warnings.catch_warnings():
            # EncoderDecoderModel warns on every call with labels that it computes the loss itself (since 4.12).
            warnings.filterwarnings("ignore", category=FutureWarning, message="Version v4.12.0")
            return super().forward(input_ids, attention_mask, encoder_outputs, passage_length, label_allowed, labels,
                                   passage_labels, **kwargs)

    def new_parameters(self) -> set[str]:
        return {name for name, _ in self.named_parameters() if self.NEW.search(name)}


def reader_class(model_type: str):
    """The FiD class for a checkpoint's `config.model_type`, or None."""
    return {"t5": FiDT5, "encoder-decoder": FiDEncoderDecoder}.get(model_type)


def decoder_start_id(model) -> int:
    """The token a reader's answers start from (generation config first, as `generate()` reads it)."""
    config = model.generation_config
    return config.decoder_start_token_id if config.decoder_start_token_id is not None else model.config.decoder_start_token_id
