"""The one training loop: FiD and span-corruption reader training, phrase, document and query-side
retriever training all run `train(task, args, engine, out)`.

A `Task` says what is trained (the model, its micro-batches, its loss, how to evaluate and save it);
`OptimArgs` (odqa.common.settings) holds every loop setting; the engine is DeepSpeed (ZeRO, its JSON's
"auto" values filled from the settings) or accelerate (one process, or DDP). Launch under `deepspeed`,
`torchrun` or `accelerate launch`; a plain process is a one-process run (gloo on CPU).

Data order: an epoch's micro-batches are a function of (seed, epoch) alone, and optimizer step s
consumes micro-batches s*W*A ... (s+1)*W*A - 1 (W processes, A accumulation steps), rank r taking every
W-th, so W processes with A steps make the same updates as one process with W*A steps. A checkpoint
(OUT/checkpoint, after each epoch, every `save_steps` and at the end, written to a temporary name and
renamed) holds the engine's state and the loop's; a resumed run repeats the uninterrupted one's losses:
DeepSpeed reseeds dropout from (seed, step, rank) each step, accelerate's checkpoint carries the
random generators' states.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from odqa.common.artifact import plain
from odqa.common.io import InputError, atomic_path, publish, read_json, require_file, write_json
from odqa.common.model_card import Card
from odqa.common.settings import OptimArgs
from odqa.common.tracking import Trackers
from odqa.common.weights import seal

log = logging.getLogger(__name__)


@dataclass
class Task:
    """What the loop trains.

    `batches(epoch)` gives that epoch's `n_batches` micro-batches (indexable; built lazily is fine), the
    same ones whenever it is asked for the same epoch, a None for one to skip; `loss(model, batch, step)`
    gets the engine's wrapped model and must call it (its forward: DDP and DeepSpeed synchronise only
    what runs there), and gives (loss, {name: float}) to log; `evaluate(model, rank, world)` gives a dict
    holding `metric`, higher is better (every rank calls it); `save(model, path)` writes a plain
    checkpoint into the new directory `path`. `groups`: parameter groups (default: the trainable
    weights decayed, biases and norms not)."""
    model: torch.nn.Module
    n_batches: int
    batches: Callable[[int], Sequence]
    loss: Callable[[Any, Any, int], tuple[torch.Tensor, dict]]
    save: Callable[[torch.nn.Module, Path], None]
    evaluate: Callable[[torch.nn.Module, int, int], dict] | None = None
    metric: str | None = None
    groups: list[dict] | None = None
    card: Card | None = None   # what `best/` and `last/` say of themselves in their README.md


class MicroBatches(Sequence):
    """An epoch's micro-batches, collated when asked for: `make(examples, m)` for micro-batch m."""

    def __init__(self, examples: Sequence, order: list[list[int]], make: Callable[[list, int], Any]):
        self.examples, self.order, self.make = examples, order, make

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, m: int):
        return self.make([self.examples[i] for i in self.order[m]], m)


def shuffled_batches(n_examples: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The reader's order: Python's shuffle seeded by (seed, epoch), the last partial batch dropped."""
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return [order[i:i + batch_size] for i in range(0, n_examples - batch_size + 1, batch_size)]


def permuted_batches(n_examples: int, batch_size: int, seed: int) -> list[list[int]]:
    """The retrievers' order: what DataLoader(shuffle=True, drop_last=True, generator seeded `seed`)
    yields. Its iterator draws a worker base seed from the generator before the sampler's permutation,
    so that draw is made here too."""
    g = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    order = torch.randperm(n_examples, generator=g).tolist()
    return [order[i:i + batch_size] for i in range(0, n_examples - batch_size + 1, batch_size)]


def seeded(seed: int) -> None:
    """Seed Python's and torch's generators (initialisation of new weights, dropout)."""
    random.seed(seed)
    torch.manual_seed(seed)


def default_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
            {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]


def to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def setup_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device) for DeepSpeed. Fills the launcher's environment for a plain single
    process (else DeepSpeed asks for mpi4py)."""
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


def deepspeed_config(args: OptimArgs, total_steps: int, world: int, device: torch.device,
                     group_lrs: list[float] | None = None) -> dict:
    """The JSON with every "auto" filled from `args`; `group_lrs`, one peak rate per parameter group,
    where the groups have rates of their own (the scheduler takes a list)."""
    config = copy.deepcopy(read_json(require_file(args.deepspeed_config, "DeepSpeed config")))
    cuda = device.type == "cuda"
    # On CPU, bf16 is autocast around the forward (`cpu_autocast`), not DeepSpeed's bf16 weights.
    bf16 = cuda and args.precision != "fp32" and torch.cuda.is_bf16_supported(including_emulation=False)
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
        # DeepSpeed's WarmupLR refuses 0 (and warms up over at least 2 steps whatever it is given).
        "warmup_num_steps": max(min(args.warmup(total_steps), total_steps - 1), 1),
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


def cpu_autocast(args: OptimArgs, device: torch.device):
    """`--precision bf16` on CPU: the forward under torch's bfloat16 autocast, the weights, gradients and
    optimizer state in float32. On a CPU that computes bfloat16 natively (AVX512-BF16, AMX) a FiD step
    runs 1.3-1.5x faster (docs/notes/reader.md); elsewhere torch emulates it, slower than float32."""
    if device.type != "cpu" or args.precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def _warn_emulated_bf16(args: OptimArgs, device: torch.device) -> None:
    from odqa.common.device import cpu_has_bf16
    if device.type == "cpu" and args.precision == "bf16" and not cpu_has_bf16():
        log.warning("--precision bf16: this CPU has no native bfloat16 (AVX512-BF16 or AMX); it will be "
                    "emulated, slower than fp32")


class DeepSpeedEngine:
    """ZeRO through `deepspeed.initialize`; optimizer, scheduler, clipping and precision from the JSON
    (on CPU, `--precision bf16` is autocast: `cpu_autocast`)."""

    def __init__(self, args: OptimArgs):
        self.args = args
        self.rank, self.world, self.device = setup_distributed()
        _warn_emulated_bf16(args, self.device)

    def autocast(self):
        return cpu_autocast(self.args, self.device)

    def prepare(self, model: torch.nn.Module, groups: list[dict], total_steps: int) -> dict:
        import deepspeed
        lrs = [g.get("lr", self.args.lr) for g in groups]
        config = deepspeed_config(self.args, total_steps, self.world, self.device, lrs)
        self.model, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
        self.module = self.model.module
        return config

    @contextlib.contextmanager
    def accumulating(self, boundary: bool):
        yield   # DeepSpeed reduces gradients at the accumulation boundary by itself

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss)   # divides by the accumulation steps

    def micro_step(self, boundary: bool) -> None:
        self.model.step()           # applies the update at the accumulation boundary only

    def skip_step(self) -> None:
        self.model.lr_scheduler.step()

    def lr(self) -> float:
        return self.model.get_lr()[0]

    def seed_step(self, step: int) -> None:
        # Its checkpoints hold no random state: dropout is a function of (seed, step, rank) instead.
        torch.manual_seed(self.args.seed * 1_000_003 + step * self.world + self.rank)

    def save(self, directory: Path) -> None:
        self.model.save_checkpoint(str(directory), tag="state")

    def load(self, directory: Path) -> None:
        self.model.load_checkpoint(str(directory))

    def gathered(self):
        """At ZeRO-3, the whole weights for the block's duration (to save them)."""
        import deepspeed
        if self.model.zero_optimization_stage() == 3:
            return deepspeed.zero.GatheredParameters(list(self.module.parameters()), modifier_rank=None)
        return contextlib.nullcontext()

    def barrier(self) -> None:
        torch.distributed.barrier()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            torch.distributed.all_reduce(values)
            values = values / self.world
        return values


class AccelerateEngine:
    """torch's AdamW with linear warm-up and decay, prepared by accelerate (DDP over several processes)."""

    def __init__(self, args: OptimArgs):
        from accelerate import Accelerator, DistributedDataParallelKwargs
        if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
            raise InputError("for DeepSpeed pass --backend deepspeed (it runs under accelerate launch without "
                             "--use_deepspeed, and on CPU too)")
        self.args = args
        # cpu=True on a machine without CUDA, or accelerate treats torchrun's processes as unrelated
        # single runs. find_unused_parameters: the LMs' pooler layers take no part.
        self.accelerator = Accelerator(
            cpu=not torch.cuda.is_available(),
            # On CPU bf16 is the loop's autocast (`cpu_autocast`), as with DeepSpeed.
            mixed_precision=("no" if args.precision == "bf16" and not torch.cuda.is_available()
                             else {"auto": None, "bf16": "bf16", "fp32": "no"}[args.precision]),
            kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.device = self.accelerator.device
        _warn_emulated_bf16(args, self.device)

    def autocast(self):
        # on CUDA accelerate's mixed_precision wraps the prepared model's forward instead
        return cpu_autocast(self.args, self.device)

    def prepare(self, model: torch.nn.Module, groups: list[dict], total_steps: int) -> dict:
        from transformers import get_linear_schedule_with_warmup
        optimizer = torch.optim.AdamW(groups, lr=self.args.lr, weight_decay=self.args.weight_decay)
        # Not prepared: accelerate would step it once per process per call.
        self.scheduler = get_linear_schedule_with_warmup(optimizer, self.args.warmup(total_steps), total_steps)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.accelerator.register_for_checkpointing(self.scheduler)
        self.module = self.accelerator.unwrap_model(self.model)
        return {"optimizer": "AdamW", "scheduler": "linear", "total_steps": total_steps,
                "warmup_steps": self.args.warmup(total_steps), "processes": self.world}

    def accumulating(self, boundary: bool):
        return contextlib.nullcontext() if boundary else self.accelerator.no_sync(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        self.accelerator.backward(loss / self.args.accumulation if self.args.accumulation > 1 else loss)

    def micro_step(self, boundary: bool) -> None:
        if boundary:
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.scheduler.step()

    def skip_step(self) -> None:
        self.scheduler.step()

    def lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def seed_step(self, step: int) -> None:
        pass   # the checkpoint restores the random generators' states

    def save(self, directory: Path) -> None:
        self.accelerator.save_state(str(directory))

    def load(self, directory: Path) -> None:
        self.accelerator.load_state(str(directory))

    def gathered(self):
        return contextlib.nullcontext()

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        return self.accelerator.reduce(values, "mean") if self.world > 1 else values


ENGINES = {"deepspeed": DeepSpeedEngine, "accelerate": AccelerateEngine}


def make_engine(args: OptimArgs):
    """The engine `args.backend` names; it also sets up the process group, so make it before loading data
    that depends on the rank."""
    return ENGINES[args.backend](args)


def check_resumable(ckpt: Path, saved: dict, now: dict) -> None:
    """Refuse a resume whose optimizer would not fit the checkpoint's: other weights trained (what is held
    fixed, which weights take their own rate) or another engine. Checkpoints older than the record pass."""
    if saved == now:
        return
    differs = ", ".join(f"{k} {saved.get(k)} there, {now[k]} here" for k in now if saved.get(k) != now[k])
    raise InputError(f"--resume: {ckpt} was written by a run that trained other weights or used another engine "
                     f"({differs}; group_sizes counts the weights each optimizer group trains): resume with the "
                     f"interrupted run's settings (what it holds fixed, its rates, --backend, --zero-stage), "
                     f"or train into a fresh --out")


# What a resumed run may change: how long it trains, how often it logs, evaluates and saves, and where
# its DeepSpeed JSON lies (the ZeRO stage is checked against the checkpoint, `check_resumable`).
RESUME_MAY_CHANGE = frozenset({"resume", "epochs", "max_steps", "eval_steps", "save_steps", "log_steps", "report_to",
                               "deepspeed_config"})


def check_resumed_settings(record: str | os.PathLike, settings: dict, key: str | None = None) -> None:
    """Refuse to resume with settings other than those the interrupted run wrote to `record` (under `key`):
    its data, model, rates and losses made the checkpoint, and a resume that changed them would train
    another recipe on top of it unnoticed. Only RESUME_MAY_CHANGE may differ; a run with no record
    (interrupted before writing it) passes."""
    record = Path(record)
    if not record.exists():
        return
    saved = read_json(record)
    saved = saved.get(key, {}) if key else saved
    now = plain(settings)
    differs = [k for k, v in now.items() if k not in RESUME_MAY_CHANGE and k in saved and not _same_setting(saved[k], v)]
    if differs:
        said = "; ".join(f"{k} {saved[k]!r} there, {now[k]!r} here" for k in differs)
        raise InputError(f"--resume: {record} was written by a run with other settings ({said}): resume with "
                         f"the interrupted run's settings, or train into a fresh --out")


def _same_setting(saved, now) -> bool:
    """Equal, or the same existing file or folder typed another way ("run/q", "./run/q", its absolute path):
    records keep paths as typed, and a resume's command line is typed anew."""
    if saved == now:
        return True
    if isinstance(saved, list) and isinstance(now, list):
        return len(saved) == len(now) and all(map(_same_setting, saved, now))
    if isinstance(saved, str) and isinstance(now, str) and saved and now:
        try:
            return os.path.samefile(saved, now)
        except OSError:   # not both existing paths
            return False
    return False


def train(task: Task, args: OptimArgs, engine, out: str | os.PathLike, desc: str = "train") -> dict:
    """Train `task` as `args` say; returns the loop's state (history, evaluations, best)."""
    out = Path(out)
    rank, W, A = engine.rank, engine.world, args.accumulation   # the names of the module's docstring
    per_step = W * A
    steps_per_epoch = task.n_batches // per_step
    if steps_per_epoch == 0:
        raise InputError(f"{task.n_batches} micro-batches of {args.batch_size} do not fill one step of "
                         f"{A} accumulation x {W} processes")
    total = args.max_steps if args.max_steps is not None else steps_per_epoch * args.epochs
    groups = task.groups if task.groups is not None else default_groups(task.model, args.weight_decay)
    groups = [g for g in groups if g["params"]]
    sizes = [sum(p.numel() for p in g["params"]) for g in groups]   # before ZeRO-3 partitions them
    config = engine.prepare(task.model, groups, total)
    # What the optimizer state is shaped by: a checkpoint of another shape fails deep inside the engine.
    trains = {"backend": args.backend, "zero_stage": config.get("zero_optimization", {}).get("stage"),
              "group_sizes": sizes}
    state = {"epoch": 0, "step_in_epoch": 0, "global_step": 0, "best": None, "history": [], "evals": []}
    ckpt = out / "checkpoint"
    if args.resume:
        check_resumed_settings(out / "train_config.json", asdict(args), key="loop")
        if (ckpt / "trainer_state.json").exists():
            state = read_json(ckpt / "trainer_state.json")
            check_resumable(ckpt, state.get("trains", trains), trains)
            engine.load(ckpt)
            log.info("%s: resumed from %s at step %d", desc, ckpt, state["global_step"])
        else:
            log.warning("--resume: no checkpoint in %s, starting from scratch", ckpt)
    state["trains"] = trains   # a checkpoint older than the record gets it from here on
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        write_json(out / "train_config.json", {"loop": asdict(args), args.backend: config, "world_size": W,
                                               "steps_per_epoch": steps_per_epoch, "total_steps": total})

    def save_model(name: str, info: dict) -> None:
        with engine.gathered():
            if rank == 0:
                with atomic_path(out / name) as tmp:
                    task.save(engine.module, tmp)
                    write_json(tmp / "trainer_info.json", info)
                    if task.card is not None:
                        (tmp / "README.md").write_text(task.card.text(name, info), encoding="utf-8")
                    seal(tmp)
        engine.barrier()

    def checkpoint() -> None:
        # Every process writes its part (DeepSpeed its shards, accelerate its random states) into one
        # temporary directory, which rank 0 renames once all are done.
        tmp = out / ".checkpoint.tmp"
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        engine.barrier()
        engine.save(tmp)
        engine.barrier()
        if rank == 0:
            write_json(tmp / "trainer_state.json", state, indent=None)
            publish(tmp, ckpt)
        engine.barrier()

    trackers = Trackers(args.report_to, out, desc, args, rank)

    def evaluate() -> None:
        engine.module.eval()
        result = task.evaluate(engine.module, rank, W)
        engine.module.train()
        trackers.log({f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}, state["global_step"])
        value = result[task.metric]
        state["evals"].append({"step": state["global_step"], "epoch": state["epoch"], **result})
        if state["best"] is None or value > state["best"]["value"]:
            state["best"] = {"step": state["global_step"], "value": value}
            save_model("best", {"step": state["global_step"], **result})
        log.info("%s step %d: %s", desc, state["global_step"], ", ".join(f"{k} {v:.4f}" for k, v in result.items()))

    with trackers:   # a run that fails still closes its trackers' runs and files
        engine.module.train()
        bar = tqdm(total=total, initial=state["global_step"], desc=desc, unit=" step", disable=rank != 0 or None,
                   mininterval=2)
        running, since, since_step = [], time.perf_counter(), state["global_step"]
        while state["global_step"] < total:
            batches = task.batches(state["epoch"])
            for s in range(state["step_in_epoch"], steps_per_epoch):
                step = state["global_step"]
                engine.seed_step(step)
                micro = [batches[s * per_step + a * W + rank] for a in range(A)]
                skip = torch.tensor([float(any(b is None for b in micro))], device=engine.device)
                if engine.mean(skip).item() > 0:   # all processes skip together, or DDP waits forever
                    engine.skip_step()
                else:
                    sums: dict[str, float] = {}
                    for a, batch in enumerate(micro):
                        boundary = a == A - 1
                        with engine.accumulating(boundary):
                            with engine.autocast():
                                loss, parts = task.loss(engine.model, to_device(batch, engine.device), step)
                            engine.backward(loss)
                        engine.micro_step(boundary)
                        for k, v in parts.items():
                            sums[k] = sums.get(k, 0.0) + v / A
                    keys = sorted(sums)
                    values = engine.mean(torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=engine.device))
                    state["history"].append({"step": step + 1, "epoch": state["epoch"] + 1,
                                             **dict(zip(keys, values.tolist())), "lr": engine.lr()})
                    running.append(state["history"][-1])
                state["global_step"] = step + 1
                state["step_in_epoch"] = s + 1
                bar.update(1)
                if (state["global_step"] % args.log_steps == 0 or state["global_step"] == total) and running:
                    means = {k: sum(h[k] for h in running) / len(running) for k in running[-1] if k not in ("step", "epoch")}
                    bar.set_postfix(loss=f"{means['loss']:.4f}", epoch=state["epoch"] + 1)
                    if bar.disable and rank == 0:   # no terminal (a log file): say it in the log instead
                        log.info("%s step %d/%d: loss %.4f", desc, state["global_step"], total, means["loss"])
                    now = time.perf_counter()
                    examples = (state["global_step"] - since_step) * per_step * args.batch_size
                    trackers.log({**{f"train/{k}": v for k, v in means.items()}, "train/lr": engine.lr(),
                                  "train/epoch": state["epoch"] + (s + 1) / steps_per_epoch,
                                  "train/examples_per_second": examples / max(now - since, 1e-9)}, state["global_step"])
                    running.clear()
                    since, since_step = now, state["global_step"]
                last = state["global_step"] == total
                epoch_end = s + 1 == steps_per_epoch
                if epoch_end:   # before the checkpoint, so that a resumed run starts the next epoch
                    state["epoch"] += 1
                    state["step_in_epoch"] = 0
                if task.evaluate is not None and (last or (args.eval_steps and state["global_step"] % args.eval_steps == 0)
                                                  or (not args.eval_steps and epoch_end)):
                    evaluate()
                if last or epoch_end or (args.save_steps and state["global_step"] % args.save_steps == 0):
                    checkpoint()
                if last:
                    break
        bar.close()
    # the last checkpoint's card gives the validation figures of its own step, where it was evaluated there
    last_eval = next((e for e in reversed(state["evals"]) if e.get("step") == state["global_step"]), {})
    save_model("last", {**{k: v for k, v in last_eval.items() if k != "epoch"}, "step": state["global_step"]})
    if rank == 0:
        write_json(out / "trainer_state.json", state)
    return state
