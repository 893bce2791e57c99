"""DensePhrases' encoders: every passage token gets a start and an end vector, a question gets one
of each, and a phrase (i, j), j - i < L, scores `q_start . h_start[i] + q_end . h_end[j]`.

Three ways to get start/end vectors from the phrase LM's hidden state h (dimension d):
  head="split"   the paper's: h[:d/2] is the start vector, h[d/2:] the end vector (no new weights);
  head="linear"  two d x d linear heads (full-width vectors), started as the split: the same scores;
  head="full"    h is both (DensePhrases' released code and models: start and end are "shared").
Question vectors come from the [CLS] of two LMs started from the same checkpoint (question_encoder=
"dual", the paper's choice) or of one shared LM with two heads ("shared").
A filter head gives each token a "can start" and a "can end an answer" logit, used to drop tokens from
the phrase dump.
"""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from odqa.common.io import InputError, atomic_path, hash_files, loading
from odqa.common.timings import stage
from odqa.common.weights import check_sealed, read_state_dict, refuse_misfit, seal, weight_file, weight_keys
from odqa.retriever.args import PhraseModelConfig
from odqa.retriever.lm import load_lm, open_checkpoint, saving_checkpoint
from odqa.retriever.phrase_data import encode_questions

CONFIG_FILE = "phrase_config.json"
LMS = ("phrase_lm", "q_start_lm", "q_end_lm")
# DensePhrases' checkpoints (princeton-nlp/densephrases-*): the LMs' key prefixes, its first release's
# names for them, and the teacher a distilled model was saved with
DENSEPHRASES_LMS = {"phrase_lm": "phrase_encoder.", "q_start_lm": "query_start_encoder.",
                    "q_end_lm": "query_end_encoder."}
DENSEPHRASES_OLD = {"bert_start": "phrase_encoder", "bert_q_start": "query_start_encoder",
                    "bert_q_end": "query_end_encoder"}
DENSEPHRASES_TEACHER = ("cross_encoder.", "bert_qd.", "qa_outputs.")


class DensePhraseModel(nn.Module):
    def __init__(self, config: PhraseModelConfig, lms: dict[str, nn.Module] | None = None,
                 questions_only: bool = False):
        """`questions_only`: without the phrase LM, which a search never runs (the index holds its
        vectors): a third of the weights, not loaded. Such a model encodes questions and is not saved."""
        super().__init__()
        self.config = config
        load = lambda: load_lm(config.encoder)  # noqa: E731
        lms = lms or {}
        self.phrase_lm = None if questions_only else lms.get("phrase_lm") or load()
        self.q_start_lm = lms.get("q_start_lm") or load()
        self.q_end_lm = (lms.get("q_end_lm") or load()) if config.question_encoder == "dual" else None
        d = self.q_start_lm.config.hidden_size
        if config.head == "split" and d % 2:
            raise ValueError(f"head='split' needs an even hidden size, {config.encoder} has {d}")
        self.dim = d // 2 if config.head == "split" else d
        if config.head == "linear":
            # Started as the split head padded with zeros, so that the model begins as the paper's and
            # may grow into the full width: random heads cost 4.75 EM at a short budget (docs/notes/retrieval.md).
            self.start_head, self.end_head = _half_identity(d, first=True), _half_identity(d, first=False)
        if config.question_encoder == "shared":
            # One LM for both question vectors: two heads keep them apart.
            self.q_start_head, self.q_end_head = nn.Linear(d, d), nn.Linear(d, d)
        self.filter_head = nn.Linear(d, 2)
        self.densephrases = False   # loaded from a DensePhrases checkpoint, and saved as one

    @property
    def shared_sides(self) -> bool:
        """Whether a token's start and end vectors are one vector (head "full"): dumped and indexed once."""
        return self.config.head == "full"

    def _split(self, h: torch.Tensor, start_head: str, end_head: str) -> tuple[torch.Tensor, torch.Tensor]:
        if self.config.head == "split":
            return h[..., : self.dim], h[..., self.dim:]
        if self.config.head == "full":
            return h, h
        return getattr(self, start_head)(h), getattr(self, end_head)(h)

    def encode_passages(self, input_ids, attention_mask, token_type_ids=None):
        """Start and end vectors (B, T, dim) and filter logits (B, T, 2) for every token."""
        if self.phrase_lm is None:
            raise ValueError("this phrase model was loaded for questions only (questions_only=True)")
        h = self.phrase_lm(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state
        start, end = self._split(h, "start_head", "end_head")
        return start, end, self.filter_head(h)

    def encode_questions(self, input_ids, attention_mask, token_type_ids=None):
        """Question start and end vectors, (B, dim) each."""
        kw = dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        if self.config.question_encoder == "shared":
            cls = self.q_start_lm(**kw).last_hidden_state[:, 0]
            if self.config.head == "split":
                return cls[:, : self.dim], cls[:, self.dim:]
            return self.q_start_head(cls), self.q_end_head(cls)
        cls_s = self.q_start_lm(**kw).last_hidden_state[:, 0]
        cls_e = self.q_end_lm(**kw).last_hidden_state[:, 0]
        if self.config.head == "split":
            return cls_s[:, : self.dim], cls_e[:, self.dim:]
        return cls_s, cls_e

    def forward(self, questions: dict, passages: dict | None = None, negatives: dict | None = None) -> dict:
        """One training step's encodings (the questions' alone for query-side training). Training calls
        this rather than the two methods above because DDP and DeepSpeed synchronise gradients only for
        work done inside the wrapped model's forward."""
        out = dict(zip(("q_start", "q_end"), self.encode_questions(**questions)))
        if passages is not None:
            out.update(zip(("h_start", "h_end", "filter"), self.encode_passages(**passages)))
        if negatives is not None:
            out.update(zip(("neg_start", "neg_end"), self.encode_passages(**negatives)[:2]))
        return out

    # --- checkpoints: one directory, each LM a plain HF checkpoint, heads in heads.pt ---

    def save_pretrained(self, out_dir: str | os.PathLike, tokenizer=None) -> None:
        """A model loaded from a DensePhrases checkpoint is saved as one again (so DensePhrases' own code
        reads it, and a query-tuned copy still matches the index its phrase side built)."""
        if self.phrase_lm is None:
            raise ValueError("a phrase model loaded for questions only would be saved without its phrase LM")
        if self.densephrases:
            return self._save_densephrases(out_dir, tokenizer)
        lms = {name: getattr(self, name) for name in LMS}
        with saving_checkpoint(out_dir, lms, self.config, CONFIG_FILE, tokenizer) as tmp:
            heads = {k: v for k, v in self.state_dict().items() if not k.split(".")[0].endswith("_lm")}
            torch.save({k: v for k, v in heads.items() if not k.startswith("q_")}, tmp / "phrase_heads.pt")
            torch.save({k: v for k, v in heads.items() if k.startswith("q_")}, tmp / "question_heads.pt")

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, questions_only: bool = False) -> "DensePhraseModel":
        """A checkpoint `save_pretrained` wrote, or one of DensePhrases' (`densephrases_layout`);
        `questions_only`: its question side alone (see __init__)."""
        path = Path(path)
        if not is_phrase_checkpoint(path) and densephrases_layout(path):
            model = cls._from_densephrases(path)
            if questions_only:
                model.phrase_lm = None
            return model
        names = LMS[1:] if questions_only else LMS
        config, lms = open_checkpoint(path, CONFIG_FILE, PhraseModelConfig, names, "phrase model")
        with loading(path, "the phrase model"):
            model = cls(config, lms, questions_only)
        expected = model.state_dict()
        heads = {}
        for name in ("phrase_heads.pt", "question_heads.pt"):
            with loading(path / name, "the heads"):
                part = torch.load(path / name, map_location="cpu")
            if not isinstance(part, dict):
                raise InputError(f"{path / name}: expected a dict of tensors, got {type(part).__name__}")
            for key, value in part.items():
                if key in expected and getattr(value, "shape", None) != expected[key].shape:
                    raise InputError(f"{path / name}: {key} has shape {tuple(getattr(value, 'shape', ()))}, "
                                     f"but {CONFIG_FILE} makes it {tuple(expected[key].shape)}")
            heads.update(part)
        missing, unexpected = model.load_state_dict(heads, strict=False)
        bad = [k for k in missing if not k.split(".")[0].endswith("_lm")] + unexpected
        if bad:
            raise InputError(f"{path}: the saved heads do not fit the configured model: {bad[:5]}")
        return model


    def _save_densephrases(self, out_dir: str | os.PathLike, tokenizer=None) -> None:
        state = {prefix + k: v for name, prefix in DENSEPHRASES_LMS.items()
                 for k, v in getattr(self, name).state_dict().items()}
        state.update({f"filter_linear.{k}": v for k, v in self.filter_head.state_dict().items()})
        with atomic_path(out_dir) as tmp:
            tmp.mkdir()
            torch.save(state, tmp / "pytorch_model.bin")
            self.phrase_lm.config.to_json_file(tmp / "config.json")
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
            seal(tmp)

    @classmethod
    def _from_densephrases(cls, path: Path) -> "DensePhraseModel":
        """DensePhrases' `Encoder`: its three LMs, each of the config's class, and `filter_linear` as the
        filter head (its two outputs are "can start" and "can end", as the filter head's are). Start and
        end are both the phrase LM's token state and the question's come from each query LM's [CLS], as
        densephrases/encoder.py computes them: head "full", question encoder "dual". Lengths are
        DensePhrases' defaults (densephrases/options.py)."""
        from transformers import AutoConfig, AutoModel
        check_sealed(path, "phrase model")   # one odqa wrote (query-tuned); DensePhrases' own loads as it is
        state = densephrases_state(path)
        with loading(path / "config.json", "the phrase model's config"):
            lm_config = AutoConfig.from_pretrained(path)
        config = PhraseModelConfig(encoder=str(path), head="full", question_encoder="dual", max_span_len=10,
                                   max_passage_tokens=384, max_question_tokens=64)
        lms, missing, used = {}, [], set()
        for name, prefix in DENSEPHRASES_LMS.items():
            lms[name] = AutoModel.from_config(lm_config)
            own = lms[name].state_dict()
            part = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)
                    and (k[len(prefix):] in own or not k.endswith("position_ids"))}   # a buffer old versions saved
            used.update(prefix + k for k in part)
            result = lms[name].load_state_dict(part, strict=False)
            missing += [prefix + k for k in result.missing_keys]
        used.update(k for k in state if k.endswith("position_ids"))
        model = cls(config, lms)
        model.densephrases = True
        head = {k.removeprefix("filter_linear."): v for k, v in state.items() if k.startswith("filter_linear.")}
        used.update(f"filter_linear.{k}" for k in head)
        result = model.filter_head.load_state_dict(head, strict=False)
        refuse_misfit(path, "DensePhrases' weights", missing + [f"filter_linear.{k}" for k in result.missing_keys],
                      sorted(set(state) - used))
        return model


def densephrases_layout(path: str | os.PathLike) -> bool:
    """A DensePhrases checkpoint directory: a `config.json` and one weight file whose keys name its three
    encoders (`phrase_encoder.*`, or `bert_start.*` in its first release)."""
    file = weight_file(path)
    if file is None or not (Path(path) / "config.json").is_file():
        return False
    return any(k.startswith(("phrase_encoder.", "bert_start.")) for k in weight_keys(file))


def densephrases_state(path: Path) -> dict:
    """A DensePhrases checkpoint's weights under today's names: its first release's `bert_start`,
    `bert_q_start` and `bert_q_end` renamed, and the distillation teacher, which search never uses, left out
    (densephrases/utils/single_utils.py's `backward_compat`)."""
    state = read_state_dict(weight_file(path), "the phrase model's weights")
    out = {}
    for key, value in state.items():
        if key.startswith(DENSEPHRASES_TEACHER):
            continue
        old = next((o for o in DENSEPHRASES_OLD if key.startswith(o + ".")), None)
        out[DENSEPHRASES_OLD[old] + key[len(old):] if old else key] = value
    return out


def _half_identity(d: int, first: bool) -> nn.Linear:
    """A d x d linear map that keeps the first (or second) half of its input and zeroes the rest."""
    head = nn.Linear(d, d)
    keep = torch.zeros(d)
    keep[: d // 2] = 1.0
    with torch.no_grad():
        head.weight.copy_(torch.diag(keep if first else 1.0 - keep))
        head.bias.zero_()
    return head


def kept_tokens(candidate: torch.Tensor, filter_logits: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """The tokens a dump keeps: candidates whose filter logit (max of "can start", "can end") passes
    `threshold`; every candidate when it is None."""
    return candidate if threshold is None else candidate & (filter_logits.max(-1).values >= threshold)


def is_phrase_checkpoint(path: str | os.PathLike) -> bool:
    return (Path(path) / CONFIG_FILE).exists()


def question_encoder_hash(path: str | os.PathLike) -> str:
    """Identifies the question side of a checkpoint (its question LMs and heads), which an answer
    memory's vectors are encoded with; query-side fine-tuning changes it. (A DensePhrases checkpoint holds
    both sides in one file: each side's hash is its tensors'.)"""
    path = Path(path)
    if not is_phrase_checkpoint(path) and densephrases_layout(path):
        return densephrases_hashes(path)[1]
    files = [f for part in ("q_start_lm", "q_end_lm") for f in sorted((path / part).rglob("*"))]
    return hash_files(path, files + [path / "question_heads.pt", path / CONFIG_FILE])


def phrase_encoder_hash(path: str | os.PathLike) -> str:
    """Identifies the phrase side of a checkpoint (phrase LM and its heads), which a phrase index is
    built with; query-side fine-tuning leaves it unchanged."""
    path = Path(path)
    if not is_phrase_checkpoint(path) and densephrases_layout(path):
        return densephrases_hashes(path)[0]
    return hash_files(path, sorted((path / "phrase_lm").rglob("*")) + [path / "phrase_heads.pt"])


def densephrases_hashes(path: Path) -> tuple[str, str]:
    """(phrase side's hash, question side's) of a DensePhrases checkpoint, both from one read of its
    weights, and read again only when the file changes: a command asks for both, and the file is
    gigabytes."""
    stat = weight_file(path).stat()
    return _densephrases_hashes(str(Path(path).resolve()), (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=4)
def _densephrases_hashes(path: str, stamp: tuple) -> tuple[str, str]:
    state = densephrases_state(Path(path))
    return (_tensors_hash(state, ("phrase_encoder.", "filter_linear.")),
            _tensors_hash(state, ("query_start_encoder.", "query_end_encoder.")))


def _tensors_hash(state: dict, prefixes: tuple[str, ...]) -> str:
    """A short sha256 of the named tensors' keys and bytes (buffers such as position_ids left out): the
    same weights hash the same whichever file holds them."""
    h = hashlib.sha256()
    for key in sorted(k for k in state if k.startswith(prefixes) and not k.endswith("position_ids")):
        h.update(key.encode())
        h.update(state[key].detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


@stage("question encoders")
@torch.no_grad()
def question_vectors_of(model: DensePhraseModel, tokenizer, questions: list[str], batch_size: int = 64,
                        device: str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """The start and end vectors of `questions` (each (n, d) float32) from a phrase model's question side."""
    for q in questions:
        if not isinstance(q, str) or not q.strip():
            raise InputError(f"empty question: {q!r}")
    out_s, out_e = [], []
    order = np.argsort([len(q) for q in questions], kind="stable")   # batches of like lengths pad less
    for a in range(0, len(questions), batch_size):
        batch = [questions[i] for i in order[a:a + batch_size]]
        enc = encode_questions(tokenizer, batch, model.config.max_question_tokens)
        qs, qe = model.encode_questions(**{k: v.to(device) for k, v in enc.items()})
        out_s.append(qs.float().cpu().numpy())
        out_e.append(qe.float().cpu().numpy())
    back = np.argsort(order)
    return np.concatenate(out_s)[back], np.concatenate(out_e)[back]
