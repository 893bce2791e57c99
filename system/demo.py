"""`odqa demo`: a recipe's stages (system/recipe.py) run in order, each reused on a rerun.

A stage is done when OUT/stages/NAME.json holds its key: the settings of the recipe's sections and
fields it uses (`Stage.uses`) and the fingerprint of the key the stage before it recorded, so changing
a setting reruns that stage and the ones after it. A setting added since a record was written reads
there as its default, so adding one rebuilds nothing; a record written by 0.1, whose keys listed flat
settings by name (system/legacy.py), counts for the same recipe and is rewritten as this release's. A
stage that was interrupted resumes from its checkpoints; one started with other settings starts over.
After each stage what is built becomes the default pipeline ($ODQA_HOME/pipeline.json, and
OUT/pipeline.json).

Time estimates (system/estimate.py) are this stage's reference cost on a 2-core CPU times the speed
of this machine, first taken from encoding a few passages, then corrected by how long the finished
stages took against their estimates.
"""
from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from odqa.common.artifact import fingerprint, portable_key
from odqa.common.defaults import record_pipeline, write_record
from odqa.common.io import InputError, read_json, write_json
from odqa.common.paths import odqa_home
from odqa.system.estimate import machine_speed, refined
from odqa.system.recipe import Recipe, Stage
from odqa.system.recipe_config import RecipeConfig, recipe_config

log = logging.getLogger(__name__)


def _stage_record(path: Path) -> dict:
    """A stage record ({"key", "result"?}), refused by name when it is not one (hand-edited, or another
    program's file)."""
    record = read_json(path)
    if not isinstance(record, dict) or not isinstance(record.get("key"), dict):
        raise InputError(f"{path}: not a stage record (a JSON object with a \"key\" object): remove it, and the "
                         f"stage runs again")
    return record


class Demo:
    """Runs a `Recipe`'s stages in its directory, skipping those done with the same key."""

    def __init__(self, cfg: RecipeConfig, out_dir: str | Path):
        self.recipe = Recipe(cfg, out_dir)
        self.out = self.recipe.out
        self.stages_dir = self.out / "stages"
        self.speed = 1.0                     # this machine's time / the reference machine's

    def done(self, stages: list[Stage], upgrade: bool = False) -> dict[str, dict | None]:
        """{name: its recorded key} of the stages done (their outputs there, their record's key this
        recipe's), None for the others. With `upgrade`, a record 0.1 wrote for the same recipe is
        rewritten as this release's."""
        out, previous, previous_old = {}, None, (None, None)
        for s in stages:
            key = {"settings": portable_key(s.settings), "after": fingerprint(previous)}
            marker = self.stages_dir / f"{s.name}.json"
            record = _stage_record(marker) if marker.exists() else None
            # 0.1's key of this stage, with paths inside $ODQA_HOME portable and (before 2026-11-29) absolute
            old = tuple({"settings": settings, "after": fingerprint(before)} for settings, before in
                        zip((portable_key(s.legacy), s.legacy), previous_old)) if s.legacy is not None else (None, None)
            if record is not None and record["key"] in old:
                if upgrade:
                    write_json(marker, {**record, "key": key})
                record = {**record, "key": key}
            same = record is not None and record["key"].get("after") == key["after"] and \
                _same(portable_key(record["key"].get("settings")), key["settings"], portable_key(s.defaults))
            out[s.name] = record["key"] if same and all(o.exists() for o in s.outputs) else None
            previous, previous_old = (record["key"] if same else key), old
        return out

    def plan(self) -> str:
        """The stages, which are done, and the time estimate of the rest; runs nothing."""
        stages = self.recipe.stages()
        done = self.done(stages)
        self._show_plan(stages, [s.name for s in stages if done[s.name] is None])
        return ""

    def execute(self) -> str:
        stages = self.recipe.stages()
        self.stages_dir.mkdir(parents=True, exist_ok=True)
        done = self.done(stages, upgrade=True)
        todo = [s.name for s in stages if done[s.name] is None]
        if todo and "data" not in todo:
            self.speed = machine_speed(self.recipe.encoder, self.recipe.corpus)
        if todo:
            _say(f"odqa demo -> {self.out}: {len(stages) - len(todo)} of {len(stages)} stages already done")
            self._show_plan(stages, todo)
        t_all = time.perf_counter()
        calibrated, spent, estimated = self.speed, 0.0, 0.0
        previous = None
        for i, name in enumerate(s.name for s in stages):
            if name not in todo:
                previous = done[name]
                continue
            now = {s.name: s for s in self.recipe.stages()}    # estimates from the sizes known by now
            s, left = now[name], sum(now[n].estimate_s for n in todo[todo.index(name):]) * self.speed
            _say(f"[{i + 1}/{len(stages)}] {name}: {s.what} (about {_minutes(s.estimate_s * self.speed)}; "
                 f"{_minutes(left)} left in all)")
            t0 = time.perf_counter()
            key = {"settings": portable_key(s.settings), "after": fingerprint(previous)}
            result = self._run_stage(s, key)
            previous = key
            took = time.perf_counter() - t0
            if name == "data":
                calibrated = self.speed = machine_speed(self.recipe.encoder, self.recipe.corpus)
                log.info("this machine takes %.2fx the reference machine's time to encode", self.speed)
            else:
                spent, estimated = spent + took, estimated + s.estimate_s
                self.speed = refined(calibrated, spent, estimated)
            _say(f"[{i + 1}/{len(stages)}] {name} done in {_minutes(took)}: {json.dumps(result)}")
            self.record()
        if todo:
            _say(f"all stages done in {_minutes(time.perf_counter() - t_all)}")
        self.record()
        return self.summary()

    def record(self) -> None:
        """Make what is built so far the default pipeline, for `odqa ask`, `serve`, `run` and `retrieve`,
        and this run's own (OUT/pipeline.json, for `odqa.load(OUT)` after another demo has become the
        default). (A rerun into the same directory retrains the model in the recorded pair's own place:
        there is no old pair to keep, and the search names the mismatch until the index stage has run.)"""
        built, forget = self.recipe.recorded_parts()
        by, settings = f"odqa demo -> {self.out}", self.recipe.settings()
        record_pipeline(built, by=by, forget=forget, settings=settings)
        write_record(self.out / "pipeline.json", built, by, settings)

    def _run_stage(self, s: Stage, key: dict) -> dict:
        """Resume a stage interrupted with the same key; anything else starts from a clean slate."""
        started = self.stages_dir / f"{s.name}.started.json"
        resume = started.exists() and _stage_record(started)["key"] == key
        if not resume:
            for path in s.clean:
                shutil.rmtree(path, ignore_errors=True)
            write_json(started, {"key": key})
        result = s.fn(resume)
        write_json(self.stages_dir / f"{s.name}.json", {"key": key, "result": result})
        started.unlink()
        return result

    def _show_plan(self, stages: list[Stage], todo: list[str]) -> None:
        for i, s in enumerate(stages, 1):
            state = f"~{_minutes(s.estimate_s * self.speed)}" if s.name in todo else "done"
            _say(f"  {i}. {s.name:<10} {state:>9}  {s.what}")
        _say(f"  estimated {_minutes(sum(s.estimate_s for s in stages if s.name in todo) * self.speed)} on a "
             f"machine as fast as the reference 2-core CPU (refined as the stages finish)")

    def summary(self) -> str:
        """The report table, and the example questions asked of the pipeline just recorded."""
        from odqa.system.pipeline import load
        from odqa.system.report import markdown
        run = self.recipe.p["run"]
        rows = read_json(run / "report.json")["rows"]
        examples = read_json(self.stages_dir / "run.json")["result"]["examples"]
        lines = [f"report ({run}/report.md, em_by_k.png, topk.png):", markdown(rows)]
        if examples:
            k = max(self.recipe.cfg.run.k)
            lines.append(f"\n{len(examples)} example questions (answer in the top {k}; FiD reads {k} passages):")
            for ex, a in zip(examples, load(self.out).ask([e["question"] for e in examples], k=k)):
                lines += [f"Q: {ex['question']}  (gold: {' | '.join(ex['answers'][:3])})",
                          f"   extractive: {a.extractive.text if a.extractive else '-'}",
                          f"   generated:  {a.generated or '(empty)'}",
                          f"   top passage: {a.passages[0].title}: {a.passages[0].text[:150]}..."]
        return "\n".join(lines)


def _same(recorded, now, default) -> bool:
    """Whether a stage record's key (or a part of it) is `now`'s, a setting the record does not name
    (added since it was written) counting as its default there (`default`, the same shape)."""
    if not (isinstance(recorded, dict) and isinstance(now, dict)):
        return recorded == now
    default = default if isinstance(default, dict) else {}
    return set(recorded) <= set(now) and all(
        _same(recorded[n], now[n], default.get(n)) if n in recorded else n in default and now[n] == default[n]
        for n in now)


def _minutes(seconds: float) -> str:
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _say(line: str) -> None:
    print(line, flush=True)


def run_demo(out_dir: str | Path | None = None, preset: str = "demo", cfg: RecipeConfig | None = None,
             plan_only: bool = False, **overrides) -> str:
    """Runs (or reuses) every stage of a recipe (a preset's, with `overrides`, or `cfg`) and returns the
    report table and the example answers."""
    name = Path(preset).stem
    out = Path(out_dir) if out_dir else odqa_home() / "runs" / ("demo" if name == "demo" else f"demo-{name}")
    cfg = recipe_config(preset, out, **overrides) if cfg is None else cfg
    if plan_only:
        return Demo(cfg, out).plan()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "demo_config.json", asdict(cfg))
    return Demo(cfg, out).execute()
