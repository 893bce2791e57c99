"""Write a preset's results page, and the README's table, from a demo run's own files, so that both show
what that run gave and nothing else:

    python scripts/results_pages.py                                  # ~/.cache/odqa/runs/demo -> docs/results/demo.md, README
    python scripts/results_pages.py --run ~/.cache/odqa/runs/demo-full --preset full --machine "..."

It reads RUN/demo_config.json (the recipe), RUN/stages/*.json (each stage's result) and
RUN/run/report.json (the report), and writes docs/results/PRESET.md; for the demo preset it also puts
the report's table into README.md between its `results:demo` markers.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"demo": "odqa demo", "full": "odqa demo --preset full"}
NAMES = {"nq-test": "NQ-test", "tqa-test": "TriviaQA-test", "tqa-test:3000": "TriviaQA-test"}
README_START, README_END = "<!-- results:demo -->", "<!-- /results:demo -->"


def readme_table(rows: list[dict]) -> str:
    from odqa.system.report import MEMORY_COLUMN
    memory = all(MEMORY_COLUMN in r for r in rows)
    lines = ["| dataset | k | questions | Top-k | extractive EM | generated EM |" + (" extractive + memory EM |" if memory else ""),
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if memory else "")]
    for r in rows:
        lines.append(f"| {NAMES.get(r['dataset'], r['dataset'])} | {r['k']} | {r['questions']} | {r['Top-k']:.1f} | "
                     f"{r['extractive EM']:.1f} | {r['generated EM']:.1f} |" + (f" {r[MEMORY_COLUMN]:.1f} |" if memory else ""))
    return "\n".join(lines)


def page(run: Path, preset: str, machine: str, when: str) -> str:
    from odqa.system.report import markdown
    rows = json.loads((run / "run" / "report.json").read_text())["rows"]
    config = json.loads((run / "demo_config.json").read_text())
    stages = sorted(run.glob("stages/*.json"), key=lambda p: p.stat().st_mtime)
    lines = [f"# Results: the {preset} preset", "",
             f"What `{COMMANDS.get(preset, f'odqa demo --preset {preset}')}` gave on {machine}, {when}: the report "
             "of its run stage, and each stage's own result, as the run wrote them. Written by",
             f"`python scripts/results_pages.py{'' if preset == 'demo' else f' --preset {preset}'}` from the run's "
             "files; the README's table comes from the same script.", "",
             "```", f"$ {COMMANDS.get(preset, f'odqa demo --preset {preset}')}", "```", "",
             "## The report", "",
             f"{config['run']['limit'] or 'All'} questions of each of {', '.join(config['run']['questions'])}; the "
             f"reader reads the top k passages. `Top-k`: questions with an answer-bearing passage in the top k; "
             "`extractive EM`: the top phrases' vote, the phrase model's own answer; `generated EM`: the FiD "
             "reader's answer; `only ... right`: the questions only one of them got right; F1: SQuAD's token F1 of "
             "each answer; `extractive + memory EM`: the vote with the answer memory's help (training questions "
             "near the question lend their answers), as `odqa ask` answers.",
             "", markdown(rows), "",
             "## Each stage's result", "",
             "| stage | result |", "|---|---|"]
    for path in stages:
        result = json.loads(path.read_text()).get("result")
        if result is not None and path.stem != "run":
            lines.append(f"| {path.stem} | `{json.dumps(result)}` |")
    changed = {k: v for k, v in config.items() if k not in ("documents", "corpus", "encoder")}
    lines += ["", "## The recipe", "",
              f"Every setting of the run's recipe (`RecipeConfig`, `system/presets/{preset}.toml`):", "",
              "```json", json.dumps(changed, indent=1), "```", "",
              "What each design decision of the recipe gave, kept or not: [decisions](decisions.md). Earlier runs "
              "and their figures: [the demo's runs](../notes/demo-runs.md).", ""]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, default=None, help="the demo's run directory (default $ODQA_HOME/runs/demo)")
    p.add_argument("--preset", default="demo", help="the preset it ran (default demo)")
    p.add_argument("--machine", default="a 2-core CPU", help="what it ran on, for the page")
    p.add_argument("--when", default=None, help="when it ran (default: the report's date)")
    args = p.parse_args()
    from odqa.common.paths import odqa_home
    run = args.run or odqa_home() / "runs" / ("demo" if args.preset == "demo" else f"demo-{args.preset}")
    report = run / "run" / "report.json"
    if not report.exists():
        print(f"no report at {report}: run `{COMMANDS.get(args.preset, 'odqa demo')}` first", file=sys.stderr)
        return 2
    when = args.when or time.strftime("%Y-%m-%d", time.localtime(report.stat().st_mtime))
    out = ROOT / "docs" / "results" / f"{args.preset}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(run, args.preset, args.machine, when))
    print(f"wrote {out}")
    if args.preset == "demo":
        readme = ROOT / "README.md"
        text = readme.read_text()
        if README_START not in text or README_END not in text:
            print(f"{readme} has no {README_START} ... {README_END} markers", file=sys.stderr)
            return 2
        head, rest = text.split(README_START, 1)
        table = readme_table(json.loads(report.read_text())["rows"])
        readme.write_text(f"{head}{README_START}\n{table}\n{README_END}{rest.split(README_END, 1)[1]}")
        print(f"wrote the table in {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
