"""Checks that every trainer of the shared loop (odqa.common.trainer) passes the same way: the ZeRO stage
and the process count must not change the updates. Each trainer's test gives `run(out,
**settings)`, which trains into `out` with those loop settings and returns (losses, weights)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent


def losses(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / "trainer_state.json").read_text())["history"]]


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of the one TensorBoard run under OUT/runs, read back with tensorboard's event reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    runs = [d for d in (out / "runs").iterdir() if d.is_dir()]
    assert len(runs) == 1, runs
    events = EventAccumulator(str(runs[0]))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def assert_reported(out: Path, metric: str | None) -> None:
    """The loop's figures reached TensorBoard: loss, learning rate and throughput, and `metric` at each
    evaluation (a trainer that evaluates), at the steps trainer_state.json records."""
    scalars = tensorboard_scalars(out)
    assert {"train/loss", "train/lr", "train/examples_per_second"} <= set(scalars), sorted(scalars)
    assert all(v > 0 for _, v in scalars["train/examples_per_second"])
    if metric is None:
        return
    state = json.loads((out / "trainer_state.json").read_text())
    assert [step for step, _ in scalars[f"eval/{metric}"]] == [e["step"] for e in state["evals"]]
    assert [v for _, v in scalars[f"eval/{metric}"]] == pytest.approx([e[metric] for e in state["evals"]])


def assert_same_training(a, b, rel: float = 1e-4, atol: float = 1e-5) -> None:
    (losses_a, weights_a), (losses_b, weights_b) = a, b
    assert len(losses_a) == len(losses_b) > 0
    assert losses_a == pytest.approx(losses_b, rel=rel)
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert weights_a[name].shape == weights_b[name].shape, name
        assert torch.allclose(weights_a[name], weights_b[name], atol=atol), name


def assert_zero3_trains_like_zero2(run, tmp_path: Path) -> None:
    """Stage 3 shards the parameters; the losses and the gathered checkpoint must not notice."""
    assert_same_training(run(tmp_path / "z2", backend="deepspeed", zero_stage=2),
                         run(tmp_path / "z3", backend="deepspeed", zero_stage=3))


def torchrun(command: list[str], nproc: int, quiet: bool = True) -> subprocess.CompletedProcess:
    """`odqa COMMAND` under torchrun with `nproc` processes of one thread each, which must succeed."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--standalone",
           "-m", "odqa.system.cli", *(["-q"] if quiet else []), *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def assert_two_processes_train_as_one_with_twice_the_accumulation(command, out: Path, load_weights) -> None:
    """`command(out)`: a CLI training command writing to `out`; each process of two takes every other
    micro-batch, so they make the updates one process makes accumulating two."""
    torchrun([*command(out / "two"), "--accumulation", "1"], nproc=2)
    torchrun([*command(out / "one"), "--accumulation", "2"], nproc=1)
    assert_same_training((losses(out / "two"), load_weights(out / "two" / "last")),
                         (losses(out / "one"), load_weights(out / "one" / "last")))


def without_dropout(encoder: Path, out: Path) -> Path:
    """A copy of a BERT checkpoint with dropout off, for checks that compare updates across process
    counts or engines (dropout masks depend on the rank and on the engine's seeding)."""
    import shutil
    shutil.copytree(encoder, out)
    config = json.loads((out / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (out / "config.json").write_text(json.dumps(config))
    return out


def wandb_records(path):
    """The records of an offline wandb run's `run-ID.wandb` file, read back as wandb's protobuf `Record`s
    (wandb 0.31 reads these files in its Go core only). The file is a leveldb log: a 7-byte header, then
    32 KiB blocks of chunks, each crc32 (4 bytes), length (2), type (1: whole, 2: first, 3: middle, 4: last)
    and data."""
    import struct

    from wandb.proto import wandb_internal_pb2
    data, pos, block, parts = Path(path).read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B", path
    while pos + 7 <= len(data):
        if block - pos % block < 7:        # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record
