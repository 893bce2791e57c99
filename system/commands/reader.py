"""The reader's commands: `reader init`, `reader cloze`, `pretrain-reader`, `train-reader` and `read`."""
from __future__ import annotations

import os
from pathlib import Path

from odqa.reader.args import ClozeArgs, LoopArgs, PretrainArgs, ReadArgs, ReaderArgs, ReaderInitArgs, ReaderSettings
from odqa.system.commands.args import (
    add_dataclass_args,
    command,
    config_arg,
    dataclass_from_args,
    stage_key,
)

LAUNCH = ("Runs as one process as is; for several, launch with `deepspeed`, `torchrun` or `accelerate launch` "
          "on `-m odqa.system.cli ...`.")


def default_reader_dir(shape: str) -> Path:
    from odqa.common.paths import odqa_home
    return odqa_home() / "readers" / f"t5-{shape}-init"


def default_warm_reader_dir() -> Path:
    from odqa.common.paths import odqa_home
    return odqa_home() / "readers" / "bert2bert-init"


def cmd_reader_init(args) -> None:
    settings = dataclass_from_args(ReaderInitArgs, args)
    if args.from_encoder is not None:
        from odqa.reader.warm_start import init_warm_reader
        out = args.out or default_warm_reader_dir()
        info = init_warm_reader(args.from_encoder, out, settings)
        print(f"bert2bert: {info['parameters']:,} parameters ({info['new_parameters']:,} new), "
              f"{args.decoder_layers} decoder layers copied from encoder layers {info['decoder_layer_sources']}"
              f"{', pointer' if args.pointer else ''}{', passage prior' if info['passage_prior'] else ''} -> {out}")
        return
    from odqa.common.corpus import PassageStore
    from odqa.common.paths import default_corpus
    from odqa.reader.t5_init import init_reader, passage_text
    store = PassageStore(args.corpus or default_corpus())
    out = args.out or default_reader_dir(args.shape)
    info = init_reader((passage_text(p) for p in store), out, settings)
    store.close()
    print(f"{args.shape} T5: {info['parameters']:,} parameters, {info['vocab_size']:,}-token SentencePiece "
          f"vocabulary (100 sentinels) -> {out}")


def cmd_reader_cloze(args) -> None:
    from odqa.common.paths import default_corpus
    from odqa.reader.cloze import write_cloze_file
    args.corpus = str(args.corpus or default_corpus())
    info = write_cloze_file(dataclass_from_args(ClozeArgs, args))
    print(f"{info['questions']} cloze questions from {info['passages']} passages, {args.k} passages each "
          f"-> {args.out}")


def cmd_pretrain_reader(args) -> None:
    from odqa.reader.pretrain import pretrain_reader
    loop = dataclass_from_args(LoopArgs, args)
    state = pretrain_reader(dataclass_from_args(PretrainArgs, args), loop)
    if int(os.environ.get("RANK", "0")) == 0:
        evals = ", ".join(f"{e['step']}: {e['loss']:.3f}" for e in state["evals"])
        print(f"validation loss by step: {evals}; {state['global_step']} steps; best checkpoint: {loop.out_dir}/best")


def cmd_train_reader(args) -> None:
    from odqa.reader.fid_train import train_reader
    loop = dataclass_from_args(LoopArgs, args)
    result = train_reader(dataclass_from_args(ReaderArgs, args), loop)
    if int(os.environ.get("RANK", "0")) == 0:
        evals = ", ".join(f"{e['step']}: {e['em']:.2f}" for e in result["evals"])
        print(f"{result['train_questions']} training questions; validation EM by step: {evals}; "
              f"{result['global_step']} steps; best checkpoint: {loop.out_dir}/best")


def cmd_read(args) -> None:
    from odqa.common.device import pick_device
    from odqa.common.ranks import current, parts_beside
    from odqa.reader.read import in_reading_dtype, load_reader, read
    # Under a launcher each rank reads its share of the questions; a killed run resumes its batches.
    device = pick_device()
    if args.model is None:   # as every other command takes the default pipeline's part
        from odqa.system.pipeline import pipeline_record
        args.model = str(pipeline_record()[1]["reader"])
    model, tokenizer = load_reader(args.model, device, args.tokenizer)
    model = in_reading_dtype(model, device)
    r = read(model, tokenizer, args.input, {args.k: args.out}, dataclass_from_args(ReaderSettings, args), device,
             limit=args.limit, parts=parts_beside(args.out), key=stage_key(args))[args.k]
    if current().main:
        unscored = f"; {r['without_answers']} without answers, left out of EM" if r["without_answers"] else ""
        em = f"EM {r['em']:.2f} on {r['scored']} questions" if r["scored"] else "no question has answers to score"
        print(f"{em}{unscored} (k={r['k']}, {r['questions'] / r['seconds']:.1f} questions/s) -> {args.out}")


def add(sub) -> None:
    from odqa.common.paths import default_corpus, odqa_home
    reader = sub.add_parser("reader", help="the FiD reader's model").add_subparsers(dest="reader_command", required=True)
    p = command(reader, "init", cmd_reader_init,
                help="a reader to train: warm-started from a BERT (--from) or a from-scratch T5",
                description="With --from: an encoder-decoder warm-started from a pretrained BERT (bert2bert): "
                            "the encoder as it is, a decoder of --decoder-layers copies of its layers with "
                            "cross-attention, one tied word embedding. Without: train a unigram SentencePiece "
                            "vocabulary on the corpus (T5's pad/eos/unk and 100 sentinels) and build a T5 of "
                            "the preset's shape. Either is saved as an HF checkpoint.")
    add_dataclass_args(p, ReaderInitArgs)

    p = command(reader, "cloze", cmd_reader_cloze,
                help="cloze questions from the corpus: practice for a from-scratch reader",
                description="Turn a name or number in a passage's sentence into a wh-word: the sentence is the "
                            "question, the span the answer, the passage one of k with k-1 random others. "
                            "Writes a FiD file for `odqa train-reader`.")
    add_dataclass_args(p, ClozeArgs, {"corpus": None, "out": str(odqa_home() / "runs" / "reader" / "cloze.jsonl")})

    p = command(sub, "pretrain-reader", cmd_pretrain_reader,
                help="T5 span-corruption pretraining on the corpus (DeepSpeed)",
                description="Mask 15%% of each passage's tokens in spans of mean length 3 and train T5 to fill "
                            "them in. " + LAUNCH)
    config_arg(p)
    add_dataclass_args(p, PretrainArgs, {"model": str(default_reader_dir("tiny")), "corpus": str(default_corpus())})
    add_dataclass_args(p, LoopArgs, {"lr": 1e-3, "batch_size": 32, "warmup_steps": 200})

    p = command(sub, "train-reader", cmd_train_reader,
                help="train the Fusion-in-Decoder reader on retrieval files (DeepSpeed)",
                description="FiD: each of the k passages encoded with the question on its own, the decoder "
                            "attends over all. Validation EM with greedy decoding; best checkpoint kept. " + LAUNCH)
    config_arg(p)
    add_dataclass_args(p, ReaderArgs)
    add_dataclass_args(p, LoopArgs)

    p = command(sub, "read", cmd_read, help="generate answers for a retrieval file with a FiD reader; print EM",
                description="Batched greedy (or beam) generation; writes {id, question, answers, prediction, em} "
                            "JSONL.")
    add_dataclass_args(p, ReadArgs)
    add_dataclass_args(p, ReaderSettings)   # --decoding phrases reads ctxs[].phrase of a phrase retrieval file
