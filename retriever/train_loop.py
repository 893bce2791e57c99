"""The epoch loop the retriever trainers share (phrase encoder, document encoder), on `accelerate`:
AdamW with linear warm-up and decay, clipping, a checkpoint each epoch (and every `save_steps`) that
`resume` continues from at the same step with the same data order, validation each epoch, the best
and the last model kept as checkpoints.

One process, or several under `accelerate launch` / `torchrun` (DDP, or DeepSpeed from accelerate's
config): each process takes every n-th batch of the epoch, the model's forward runs through the
wrapper so gradients are averaged, and `steps_per_epoch` counts batches over all processes (the
schedule is the same however many processes share it).
"""
from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs
from tqdm import tqdm
from transformers import get_linear_schedule_with_warmup

from odqa.common.io import InputError, publish, read_json, write_json
from odqa.retriever.args import OptimArgs

log = logging.getLogger(__name__)


def seeded(args: OptimArgs) -> Path:
    """Seed Python's and torch's generators from the settings (initialisation, dropout); the output
    directory of the run."""
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    return Path(args.out_dir)


def train_epochs(model: torch.nn.Module, cfg: OptimArgs, steps_per_epoch: int, desc: str, out: Path,
                 loader_for_epoch: Callable[[int], torch.utils.data.DataLoader],
                 loss_fn: Callable[[torch.nn.Module, dict, int], tuple[torch.Tensor, dict]],
                 validate: Callable[[torch.nn.Module], float],
                 save_model: Callable[[torch.nn.Module, Path], None]) -> dict:
    """`loader_for_epoch(e)` must give the same batches for the same e (seeded) so a resumed run skips
    exactly what was done; `loss_fn` gets the wrapped model and must call it (its forward), not its
    other methods; `validate` returns the number to maximise; batches may be None (skipped)."""
    # Without cpu=True accelerate treats torchrun's processes on a machine without CUDA as unrelated
    # single runs (each trains on all the data and they overwrite each other's checkpoints). With it,
    # accelerate silently drops a DeepSpeed config; without it, it counts one process: so no DeepSpeed here.
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and not torch.cuda.is_available():
        raise InputError("accelerate runs DeepSpeed only on CUDA; on CPU launch without --use_deepspeed "
                         "(DDP over gloo: `torchrun --nproc_per_node N -m odqa.system.cli ...`)")
    # find_unused_parameters: the LMs' pooler layers take no part (token and [CLS] states are read).
    accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                              kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    main = accelerator.is_main_process
    total = steps_per_epoch * cfg.epochs
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total), total)
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best": float("-inf"), "history": [],
             "validation": []}
    ckpt = out / "checkpoint"
    resuming = cfg.resume and (ckpt / "trainer_state.json").exists()
    if resuming:
        state = read_json(ckpt / "trainer_state.json")
        # train-phrase checkpoints written before this loop was shared name two keys differently
        state.setdefault("best", state.pop("best_em", float("-inf")))
        state.setdefault("validation", state.pop("validation_em", []))
    # The first loader goes through prepare() with the model: DeepSpeed reads its batch size from it.
    loader = loader_for_epoch(min(state["epoch"], cfg.epochs - 1))
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    if resuming:
        accelerator.load_state(str(ckpt))
        log.info("resumed from %s at epoch %d, step %d", ckpt, state["epoch"], state["step_in_epoch"])
    out.mkdir(parents=True, exist_ok=True)

    def save_checkpoint():
        # Every process writes its part (its RNG state; DeepSpeed its shards) into one temporary
        # directory, which the main process renames once all are done.
        tmp = out / ".checkpoint.tmp"
        if main and tmp.exists():
            shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if main:
            write_json(tmp / "trainer_state.json", state, indent=None)
            publish(tmp, ckpt)
        accelerator.wait_for_everyone()

    model.train()
    unwrapped = accelerator.unwrap_model(model)
    while state["epoch"] < cfg.epochs:
        if loader is None:  # not `or`: a DataLoader's truth is its length
            loader = accelerator.prepare_data_loader(loader_for_epoch(state["epoch"]))
        local_total = len(loader) * cfg.epochs
        bar = tqdm(accelerator.skip_first_batches(loader, state["step_in_epoch"]),
                   desc=f"{desc} epoch {state['epoch'] + 1}/{cfg.epochs}", initial=state["step_in_epoch"],
                   total=len(loader), disable=None if main else True)
        for batch in bar:
            skip = batch is None
            if accelerator.num_processes > 1:  # all processes skip together, or DDP waits forever
                skip = bool(accelerator.gather(torch.tensor([int(skip)], device=accelerator.device)).any())
            if not skip:
                loss, parts = loss_fn(model, batch, state["global_step"])
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
                bar.set_postfix(loss=f"{parts['loss']:.3f}")
                state["history"].append({"step": state["global_step"], **parts})
                if main and bar.disable and state["global_step"] % max(1, min(50, local_total // 10)) == 0:
                    log.info("%s step %d/%d: loss %.4f", desc, state["global_step"], local_total, parts["loss"])
            scheduler.step()
            state["global_step"] += 1
            state["step_in_epoch"] += 1
            if cfg.save_steps and state["global_step"] % cfg.save_steps == 0:
                save_checkpoint()
        loader = None
        unwrapped.eval()
        score = validate(unwrapped)
        unwrapped.train()
        state["epoch"] += 1
        state["step_in_epoch"] = 0
        state["validation"].append(score)
        log.info("%s epoch %d: validation %.2f", desc, state["epoch"], score)
        improved = score > state["best"]
        state["best"] = max(score, state["best"])
        if main:
            save_model(unwrapped, out / "last")
            if improved:
                save_model(unwrapped, out / "best")
        save_checkpoint()
    return state
