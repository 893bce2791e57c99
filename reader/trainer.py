"""The DeepSpeed training loop shared by `odqa train-reader` and `odqa pretrain-reader`.

Every setting lives in one place: `LoopArgs` (the command line) fills the values that the DeepSpeed
JSON (reader/configs/zero2.json by default) leaves as "auto"; the JSON holds the rest (ZeRO stage,
offload, optimizer and scheduler kinds). Launch under `deepspeed`, `torchrun` or `accelerate launch`;
a plain process sets up a one-process group itself (gloo on CPU).

The data order is a function of (seed, epoch) alone and the optimizer step s consumes micro-batches
s*W*A ... (s+1)*W*A - 1 (W processes, A accumulation steps) - rank r takes every W-th - so W processes
with A steps see the same examples per step as one process with W*A steps. Dropout is reseeded from
(seed, step, rank), so a resumed run repeats the uninterrupted one's losses.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import shutil
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from odqa.common.io import InputError, atomic_path, read_json, require_file, write_json
from odqa.reader.args import LoopArgs

log = logging.getLogger(__name__)


def setup_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device). Fills the launcher's environment for a plain single process."""
    import deepspeed
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(port)))
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), device


def deepspeed_config(args: LoopArgs, total_steps: int, world: int, device: torch.device,
                     group_lrs: list[float] | None = None) -> dict:
    """The JSON with every "auto" filled from `args`; `group_lrs`, one peak rate per parameter group,
    where the groups have rates of their own (the scheduler takes a list)."""
    config = copy.deepcopy(read_json(require_file(args.deepspeed_config, "DeepSpeed config")))
    cuda = device.type == "cuda"
    if args.precision not in ("auto", "bf16", "fp32"):
        raise InputError(f"--precision must be auto, bf16 or fp32, not {args.precision!r}")
    if args.precision == "bf16" and not cuda:
        raise InputError("--precision bf16 needs a CUDA device; on CPU the reader trains in fp32")
    bf16 = cuda and args.precision != "fp32" and torch.cuda.is_bf16_supported()
    zero = config.setdefault("zero_optimization", {})
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    if args.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cuda}
        if zero.get("stage", 0) == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": cuda}
    offloaded = zero.get("offload_optimizer", {}).get("device", "none") == "cpu"
    filled = {
        "train_micro_batch_size_per_gpu": args.batch_size,
        "gradient_accumulation_steps": args.accumulation,
        "train_batch_size": args.batch_size * args.accumulation * world,
        "gradient_clipping": args.max_grad_norm,
        "lr": args.lr, "warmup_max_lr": group_lrs if group_lrs and len(set(group_lrs)) > 1 else args.lr,
        "weight_decay": args.weight_decay,
        "total_num_steps": max(total_steps, 1),
        "warmup_num_steps": min(args.warmup_steps, max(total_steps - 1, 0)),
        # On CPU without offload, torch's AdamW rather than DeepSpeed's CUDA-only FusedAdam;
        # with offload, DeepSpeedCPUAdam.
        "torch_adam": not cuda and not offloaded,
        "enabled": bf16,
    }

    def fill(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                if value == "auto":
                    if key not in filled:
                        raise InputError(f"{args.deepspeed_config}: no setting fills \"auto\" at {path}{key}")
                    node[key] = filled[key]
                else:
                    fill(value, f"{path}{key}.")
    fill(config, "")
    if "fp16" in config and config["fp16"].get("enabled") is True and not cuda:
        raise InputError(f"{args.deepspeed_config}: fp16 needs a CUDA device")
    return config


def micro_batch_order(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [order[i:i + batch_size] for i in range(0, n_examples - batch_size + 1, batch_size)]


@dataclass
class Task:
    """What the loop trains on. `make_batch(examples, rng)` gives model inputs with labels;
    `evaluate(model, rank, world)` gives a metric where higher is better (every rank must call it)."""
    examples: Sequence
    make_batch: Callable[[list, random.Random], dict]
    evaluate: Callable[[torch.nn.Module, int, int], dict]
    metric: str


def save_hf(engine, model, tokenizer, out: Path, rank: int, extra: dict | None = None) -> None:
    """A plain HF checkpoint (what `from_pretrained` reads), written atomically by rank 0.
    At ZeRO-3 the shards are gathered first."""
    import deepspeed
    gather = engine.zero_optimization_stage() == 3
    ctx = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None) if gather else contextlib.nullcontext()
    with ctx:
        if rank == 0:
            with atomic_path(out) as tmp:
                model.save_pretrained(str(tmp))
                tokenizer.save_pretrained(str(tmp))
                if extra:
                    write_json(tmp / "trainer_info.json", extra)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def parameter_groups(model, args: LoopArgs) -> list[dict]:
    """One group at `lr`, or, with `new_lr` and a model that names its new weights, two."""
    new = model.new_parameters() if args.new_lr is not None and hasattr(model, "new_parameters") else set()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for n, p in named if n not in new], "lr": args.lr},
              {"params": [p for n, p in named if n in new], "lr": args.new_lr}]
    return [g for g in groups if g["params"]]


def train_loop(model, tokenizer, task: Task, args: LoopArgs, rank: int, world: int,
               device: torch.device) -> dict:
    import deepspeed
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    per_step = world * args.accumulation
    micro_per_epoch = len(task.examples) // args.batch_size
    steps_per_epoch = micro_per_epoch // per_step
    if steps_per_epoch == 0:
        raise InputError(f"{len(task.examples)} training examples do not fill one step of "
                         f"{args.batch_size} x {args.accumulation} accumulation x {world} processes")
    total = args.max_steps if args.max_steps is not None else steps_per_epoch * args.epochs
    groups = parameter_groups(model, args)
    config = deepspeed_config(args, total, world, device, [g["lr"] for g in groups])
    if args.gradient_checkpointing:
        model.encoder_gradient_checkpointing()
    model.config.use_cache = False
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best": None, "history": [], "evals": []}
    ckpt_dir = out / "checkpoint"
    if args.resume:
        if (ckpt_dir / "latest").exists():
            _, client = engine.load_checkpoint(str(ckpt_dir))
            state.update(client["odqa_state"])
            log.info("resumed from %s at step %d", ckpt_dir, state["global_step"])
        else:
            log.warning("--resume: no checkpoint in %s, starting from scratch", ckpt_dir)
    if rank == 0:
        write_json(out / "train_config.json", {"loop": asdict(args), "deepspeed": config, "world_size": world,
                                               "steps_per_epoch": steps_per_epoch, "total_steps": total})

    def checkpoint():
        tag = f"step-{state['global_step']}"
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"odqa_state": state})
        if rank == 0:   # keep only the newest: DeepSpeed's `latest` now names it
            for old in ckpt_dir.glob("step-*"):
                if old.name != tag:
                    shutil.rmtree(old, ignore_errors=True)
            write_json(ckpt_dir / "trainer_state.json", state)

    def evaluate():
        engine.eval()
        result = task.evaluate(engine.module, rank, world)
        engine.train()
        value = result[task.metric]
        state["evals"].append({"step": state["global_step"], **result})
        if state["best"] is None or value > state["best"]["value"]:
            state["best"] = {"step": state["global_step"], "value": value}
            save_hf(engine, engine.module, tokenizer, out / "best", rank, {"step": state["global_step"], **result})
        log.info("step %d: %s", state["global_step"], ", ".join(f"{k} {v:.4f}" for k, v in result.items()))

    engine.train()
    bar = tqdm(total=total, initial=state["global_step"], desc="train", unit=" step", disable=rank != 0 or None,
               mininterval=2)
    running = []
    while state["global_step"] < total:
        batches = micro_batch_order(len(task.examples), args.batch_size, args.seed, state["epoch"])
        for s in range(state["step_in_epoch"], steps_per_epoch):
            if state["global_step"] >= total:
                break
            torch.manual_seed(args.seed * 1_000_003 + state["global_step"] * world + rank)
            step_loss = torch.zeros((), device=device)
            for a in range(args.accumulation):
                m = s * per_step + a * world + rank
                rng = random.Random(f"{args.seed}-{state['epoch']}-{m}")
                batch = task.make_batch([task.examples[i] for i in batches[m]], rng)
                batch = {k: v.to(device) for k, v in batch.items()}
                loss = engine(**batch).loss
                engine.backward(loss)   # DeepSpeed divides by the accumulation steps
                engine.step()           # applies the update at the accumulation boundary only
                step_loss += loss.detach().float() / args.accumulation
            if world > 1:
                torch.distributed.all_reduce(step_loss)
                step_loss /= world
            state["global_step"] += 1
            state["step_in_epoch"] = s + 1
            state["history"].append({"step": state["global_step"], "loss": step_loss.item(),
                                     "lr": engine.get_lr()[0]})
            running.append(step_loss.item())
            bar.update(1)
            if state["global_step"] % args.log_steps == 0:
                bar.set_postfix(loss=f"{sum(running) / len(running):.4f}")
                if bar.disable and rank == 0:   # no terminal (a log file): say it in the log instead
                    log.info("step %d/%d: loss %.4f", state["global_step"], total, sum(running) / len(running))
                running.clear()
            last = state["global_step"] == total
            if state["global_step"] % args.eval_steps == 0 or last:
                evaluate()
            if state["global_step"] % args.save_steps == 0 or last:
                checkpoint()
        else:
            state["epoch"] += 1
            state["step_in_epoch"] = 0
    bar.close()
    save_hf(engine, engine.module, tokenizer, out / "last", rank, {"step": state["global_step"]})
    if rank == 0:
        write_json(out / "trainer_state.json", state)
    return state
