"""The shared training loop's own guarantees, apart from any trainer: the data order it promises and
the settings it refuses. (Each trainer's tests check resuming, process counts and ZeRO stages.)"""
import json

import pytest
import torch
from torch.utils.data import DataLoader

from odqa.common.io import InputError
from odqa.common.settings import OptimArgs
from odqa.common.trainer import Task, check_resumed_settings, make_engine, permuted_batches, shuffled_batches, train


@pytest.mark.parametrize("n, batch, seed", [(53, 4, 13), (10, 3, 14), (8, 8, 0)])
def test_permuted_batches_are_the_data_loaders_order(n, batch, seed):
    loader = DataLoader(list(range(n)), batch_size=batch, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed))
    assert permuted_batches(n, batch, seed) == [b.tolist() for b in loader]


def test_an_epochs_order_depends_on_seed_and_epoch_alone():
    assert shuffled_batches(20, 3, 0, 1) == shuffled_batches(20, 3, 0, 1) != shuffled_batches(20, 3, 0, 2)
    batches = shuffled_batches(20, 3, 0, 1)
    assert len(batches) == 6 and len({i for b in batches for i in b}) == 18


@pytest.mark.parametrize("bad, message", [
    ({"accumulation": 0}, "--accumulation: must be at least 1"),
    ({"eval_steps": -1}, "--eval-steps: must be at least 0"),
    ({"backend": "horovod"}, "--backend must be one of accelerate, deepspeed"),
    ({"zero_stage": 3}, "add --backend deepspeed"),
    ({"precision": "fp8"}, "--precision must be auto, bf16 or fp32"),
])
def test_settings_that_cannot_train_are_refused_before_anything_loads(bad, message):
    with pytest.raises(InputError, match=message):
        OptimArgs(**bad)


def test_a_resume_may_change_how_long_it_trains_and_nothing_it_trains_on(tmp_path):
    from dataclasses import asdict

    from odqa.common.io import write_json
    record = tmp_path / "train_args.json"
    settings = {**asdict(OptimArgs(lr=1e-3)), "ks": (1, 2)}
    check_resumed_settings(record, settings)            # interrupted before it wrote a record
    write_json(record, settings)
    check_resumed_settings(record, {**settings, "resume": True, "epochs": 5, "max_steps": 9, "eval_steps": 3,
                                    "save_steps": 2, "log_steps": 1, "deepspeed_config": "moved/zero2.json"})
    with pytest.raises(InputError, match=r"train_args.json was written by a run with other settings \(seed 13 there, "
                                         r"7 here; lr 0.001 there, 0.01 here\)"):
        check_resumed_settings(record, {**settings, "lr": 1e-2, "seed": 7})
    # A path typed another way is the same setting; another path, or one that names nothing, is not.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")
    write_json(record, {**settings, "train_file": f"{tmp_path}/data/train.jsonl", "files": [str(tmp_path / "data")]})
    check_resumed_settings(record, {**settings, "train_file": f"{tmp_path}/data/../data/./train.jsonl",
                                    "files": [f"{tmp_path}/data/"]})
    with pytest.raises(InputError, match="train_file .* here"):
        check_resumed_settings(record, {**settings, "train_file": str(tmp_path / "data"),
                                        "files": [str(tmp_path / "data")]})
    with pytest.raises(InputError, match="files .* here"):
        check_resumed_settings(record, {**settings, "train_file": f"{tmp_path}/data/train.jsonl",
                                        "files": [str(tmp_path / "data"), str(tmp_path / "data")]})
    with pytest.raises(InputError, match="train_file .* here"):
        check_resumed_settings(record, {**settings, "train_file": str(tmp_path / "gone.jsonl"),
                                        "files": [str(tmp_path / "data")]})
    write_json(tmp_path / "train_config.json", {"loop": settings, "world_size": 1})
    with pytest.raises(InputError, match="ks \\[1, 2\\] there, \\[1, 3\\] here"):
        check_resumed_settings(tmp_path / "train_config.json", {**settings, "ks": (1, 3)}, key="loop")


@pytest.mark.parametrize("backend", ["deepspeed", "accelerate"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_bf16_on_cpu_is_autocast_around_the_forward_with_float32_weights(backend, precision, tmp_path):
    """A least-squares fit: under --precision bf16 the forward computes in bfloat16, the weights and the
    optimizer stay float32, and it still learns."""
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)
    seen = []

    def loss(model, batch, step):
        out = model(batch[0])
        seen.append(out.dtype)
        value = (out.float() - batch[1]).pow(2).mean()
        return value, {"loss": value.item()}

    model = torch.nn.Linear(8, 1)
    args = OptimArgs(backend=backend, precision=precision, batch_size=16, lr=0.05, warmup_steps=1, max_steps=40,
                     eval_steps=0, save_steps=0)
    task = Task(model=model, n_batches=4, batches=lambda epoch: [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)],
                loss=loss, save=lambda m, path: path.mkdir())
    state = train(task, args, make_engine(args), tmp_path)
    assert set(seen) == {torch.bfloat16 if precision == "bf16" else torch.float32}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert state["history"][-1]["loss"] < 0.1 * state["history"][0]["loss"]


@pytest.mark.parametrize("backend", ["deepspeed", "accelerate"])
def test_each_engine_reports_to_tensorboard_and_a_missing_tracker_is_named(backend, tmp_path):
    """--report-to through accelerate's trackers, the DeepSpeed engine's runs too: loss, learning rate and
    throughput every --log-steps, the validation figures at each evaluation."""
    from loop_checks import assert_reported, tensorboard_scalars
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1)

    def loss(model, batch, step):
        value = (model(batch[0]) - batch[1]).pow(2).mean()
        return value, {"loss": value.item()}

    def evaluate(model, rank, world):
        with torch.no_grad():
            return {"mse": (model(x) - y).pow(2).mean().item()}

    def task():
        return Task(model=torch.nn.Linear(8, 1), n_batches=4, loss=loss, save=lambda m, path: path.mkdir(),
                    batches=lambda epoch: [(x[i:i + 16], y[i:i + 16]) for i in range(0, 64, 16)],
                    evaluate=evaluate, metric="mse")
    args = OptimArgs(backend=backend, batch_size=16, lr=0.05, warmup_steps=1, max_steps=12, eval_steps=4, log_steps=2,
                     report_to="tensorboard")
    train(task(), args, make_engine(args), tmp_path / "run")
    assert_reported(tmp_path / "run", "mse")
    assert [step for step, _ in tensorboard_scalars(tmp_path / "run")["train/loss"]] == [2, 4, 6, 8, 10, 12]
    wanted = OptimArgs(backend=backend, report_to="wandb", max_steps=1)
    import accelerate.tracking
    available = accelerate.tracking.get_available_trackers
    with pytest.MonkeyPatch.context() as m:   # as on a machine without it
        m.setattr(accelerate.tracking, "get_available_trackers", lambda: [t for t in available() if str(t) != "wandb"])
        with pytest.raises(InputError, match="--report-to wandb: wandb is not installed"):
            train(task(), wanted, make_engine(wanted), tmp_path / "other")


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_wandb_offline_and_mlflow_runs_land_in_out_runs(tracker, tmp_path, monkeypatch):
    """The two trackers installed (requirements.txt): a wandb run in offline mode and an MLflow run in a file
    store, each under OUT/runs with the loss of every --log-steps and the settings."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)     # nothing may land in the working directory instead
    x = torch.randn(32, 4)

    def loss(model, batch, step):
        value = model(batch).pow(2).mean()
        return value, {"loss": value.item()}
    args = OptimArgs(batch_size=8, lr=0.01, warmup_steps=1, max_steps=4, eval_steps=0, log_steps=2, report_to=tracker)
    task = Task(model=torch.nn.Linear(4, 1), n_batches=4, loss=loss, save=lambda m, path: path.mkdir(),
                batches=lambda epoch: [x[i:i + 8] for i in range(0, 32, 8)])
    out = tmp_path / "run"
    train(task, args, make_engine(args), out)
    assert not [p for p in tmp_path.iterdir() if p.name != "run"]
    if tracker == "wandb":
        from loop_checks import wandb_records
        (run,) = (out / "runs" / "wandb").glob("offline-run-*")
        records = list(wandb_records(next(run.glob("run-*.wandb"))))
        history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                   for r in records if r.HasField("history")]
        assert [h["_step"] for h in history] == [2, 4] and all(h["train/loss"] > 0 for h in history)
        config = {u.key or "/".join(u.nested_key): json.loads(u.value_json)
                  for r in records if r.HasField("config") for u in r.config.update}
        assert config["lr"] == 0.01
    else:
        import mlflow
        client = mlflow.tracking.MlflowClient(tracking_uri=(out / "runs" / "mlruns").as_uri())
        (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
        (run,) = client.search_runs([experiment.experiment_id])
        assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [2, 4]
        assert run.data.params["lr"] == "0.01" and run.info.status == "FINISHED"



def test_a_run_that_fails_still_closes_its_trackers(tmp_path, monkeypatch):
    """A loss that raises mid-run: the figures logged before it are on disk and the trackers' runs are
    finished (a wandb or MLflow run left open shows as running for ever)."""
    from loop_checks import tensorboard_scalars

    from odqa.common.tracking import Trackers
    finished = []
    finish = Trackers.finish
    monkeypatch.setattr(Trackers, "finish", lambda self: (finished.append(len(self.trackers)), finish(self)))
    x = torch.randn(64, 8)

    def loss(model, batch, step):
        if step == 6:
            raise RuntimeError("out of memory")
        value = model(batch).pow(2).mean()
        return value, {"loss": value.item()}

    args = OptimArgs(batch_size=16, lr=0.01, warmup_steps=1, max_steps=12, eval_steps=0, log_steps=2,
                     report_to="tensorboard")
    task = Task(model=torch.nn.Linear(8, 1), n_batches=4, loss=loss, save=lambda m, path: path.mkdir(),
                batches=lambda epoch: [x[i:i + 16] for i in range(0, 64, 16)])
    with pytest.raises(RuntimeError, match="out of memory"):
        train(task, args, make_engine(args), tmp_path)
    assert finished == [1]
    assert [step for step, _ in tensorboard_scalars(tmp_path)["train/loss"]] == [2, 4, 6]


def test_deepspeed_trains_in_bf16_only_on_a_gpu_that_computes_it(monkeypatch):
    """A V100 makes bfloat16 tensors but emulates their arithmetic (torch's is_bf16_supported says yes by
    default): DeepSpeed's bf16 is turned on for a GPU that computes it natively alone."""
    from odqa.common.trainer import deepspeed_config
    args = OptimArgs(precision="bf16")
    for native, enabled in ((True, True), (False, False)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, n=native: n or including_emulation)
        config = deepspeed_config(args, 10, 1, torch.device("cuda"))
        assert config["bf16"]["enabled"] is enabled
