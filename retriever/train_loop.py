"""The epoch loop the retriever trainers share (phrase encoder, document encoder), on `accelerate`:
AdamW with linear warm-up and decay, clipping, a checkpoint each epoch (and every `save_steps`) that
`resume` continues from at the same step with the same data order, validation each epoch, the best
and the last model kept as checkpoints."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from accelerate import Accelerator
from tqdm import tqdm
from transformers import get_linear_schedule_with_warmup

from common.io import atomic_path, read_json, write_json

log = logging.getLogger(__name__)


@dataclass
class LoopConfig:
    epochs: int
    steps_per_epoch: int
    lr: float
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    save_steps: int = 0
    resume: bool = False
    desc: str = "train"


def train_epochs(model: torch.nn.Module, cfg: LoopConfig, out: Path,
                 loader_for_epoch: Callable[[int], torch.utils.data.DataLoader],
                 loss_fn: Callable[[torch.nn.Module, dict, int], tuple[torch.Tensor, dict]],
                 validate: Callable[[torch.nn.Module], float],
                 save_model: Callable[[torch.nn.Module, Path], None]) -> dict:
    """`loader_for_epoch(e)` must give the same batches for the same e (seeded) so a resumed run skips
    exactly what was done; `validate` returns the number to maximise; batches may be None (skipped)."""
    accelerator = Accelerator()
    total = cfg.steps_per_epoch * cfg.epochs
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(cfg.warmup_ratio * total), total)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best": float("-inf"), "history": [],
             "validation": []}
    ckpt = out / "checkpoint"
    if cfg.resume and ckpt.exists():
        accelerator.load_state(str(ckpt))
        state = read_json(ckpt / "trainer_state.json")
        # train-phrase checkpoints written before this loop was shared name two keys differently
        state.setdefault("best", state.pop("best_em", float("-inf")))
        state.setdefault("validation", state.pop("validation_em", []))
        log.info("resumed from %s at epoch %d, step %d", ckpt, state["epoch"], state["step_in_epoch"])
    out.mkdir(parents=True, exist_ok=True)

    def save_checkpoint():
        with atomic_path(ckpt) as tmp:
            accelerator.save_state(str(tmp))
            write_json(tmp / "trainer_state.json", state, indent=None)

    model.train()
    unwrapped = accelerator.unwrap_model(model)
    while state["epoch"] < cfg.epochs:
        loader = accelerator.skip_first_batches(loader_for_epoch(state["epoch"]), state["step_in_epoch"])
        bar = tqdm(loader, desc=f"{cfg.desc} epoch {state['epoch'] + 1}/{cfg.epochs}", initial=state["step_in_epoch"],
                   total=cfg.steps_per_epoch, disable=None if accelerator.is_main_process else True)
        for batch in bar:
            if batch is not None:
                loss, parts = loss_fn(unwrapped, batch, state["global_step"])
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
                bar.set_postfix(loss=f"{parts['loss']:.3f}")
                state["history"].append({"step": state["global_step"], **parts})
                if bar.disable and state["global_step"] % max(1, min(50, total // 10)) == 0:
                    log.info("%s step %d/%d: loss %.4f", cfg.desc, state["global_step"], total, parts["loss"])
            scheduler.step()
            state["global_step"] += 1
            state["step_in_epoch"] += 1
            if cfg.save_steps and state["global_step"] % cfg.save_steps == 0:
                save_checkpoint()
        unwrapped.eval()
        score = validate(unwrapped)
        unwrapped.train()
        state["epoch"] += 1
        state["step_in_epoch"] = 0
        state["validation"].append(score)
        log.info("%s epoch %d: validation %.2f", cfg.desc, state["epoch"], score)
        if accelerator.is_main_process:
            save_model(unwrapped, out / "last")
            if score > state["best"]:
                state["best"] = score
                save_model(unwrapped, out / "best")
        save_checkpoint()
    return state
