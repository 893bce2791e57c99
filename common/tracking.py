"""Experiment tracking for the training loop, through accelerate's trackers (`--report-to`).

accelerate's `Accelerator.init_trackers` is tied to an Accelerator, which the DeepSpeed engine does not
have; its tracker classes are not, so the loop starts them itself, on rank 0, the way `init_trackers`
does, whichever engine trains. Files of the trackers that keep them locally (TensorBoard's events,
wandb's runs, MLflow's file store) go to OUT/runs.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from odqa.common.io import InputError

REPORT_TO = ("none", "tensorboard", "wandb", "mlflow", "all")
TRACKERS = REPORT_TO[1:-1]


class Trackers:
    def __init__(self, report_to: str, out: Path, run_name: str, config, rank: int):
        self.trackers = []
        if report_to == "none" or rank != 0:
            return
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers
        available = {str(t) for t in get_available_trackers()}
        names = [n for n in TRACKERS if n in available] if report_to == "all" else [report_to]
        missing = [n for n in names if n not in available]
        if missing or not names:
            raise InputError(f"--report-to {report_to}: {', '.join(missing) or 'no tracker'} is not installed "
                             f"(pip install {' '.join(missing) or 'tensorboard'})")
        for name in names:
            tracker = _tracker(LOGGER_TYPE_TO_CLASS[name], name, run_name, out / "runs")
            tracker.start()
            tracker.store_init_configuration(hyperparameters(config))
            self.trackers.append(tracker)

    def log(self, values: dict, step: int) -> None:
        for tracker in self.trackers:
            tracker.log(values, step=step)

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()

    def __enter__(self) -> "Trackers":
        return self

    def __exit__(self, *exc) -> None:   # a run that fails still closes its trackers' runs and files
        self.finish()


def _tracker(cls, name: str, run_name: str, runs: Path):
    """accelerate's tracker `name`, its local files under `runs` (OUT/runs): TensorBoard's events, wandb's
    run directory (offline: WANDB_MODE=offline, synced later with `wandb sync`), MLflow's file store and
    artifacts, unless MLFLOW_TRACKING_URI names another store (a tracking server)."""
    runs.mkdir(parents=True, exist_ok=True)
    if name == "wandb":
        return cls(run_name, dir=str(runs))
    if name == "mlflow":
        import mlflow
        if not os.environ.get("MLFLOW_TRACKING_URI"):
            # a run's files beside its checkpoints, readable without a server or a database: MLflow 3 keeps
            # the file store working but refuses it unless asked for by this variable
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((runs / "mlruns").absolute().as_uri())
        return cls(experiment_name=run_name, logging_dir=str((runs / "mlruns").absolute()), run_name=run_name)
    return cls(run_name, str(runs)) if cls.requires_logging_directory else cls(run_name)


def hyperparameters(config) -> dict:
    """A settings dataclass as the flat str/int/float/bool values trackers take (paths and lists as text)."""
    values = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in values.items()}
