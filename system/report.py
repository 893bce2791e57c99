"""The extractive-vs-generated report: built from per-question records alone, so every number in
report.md/report.json can be recomputed from the per-question JSONL.

A record: {"dataset", "id", "question", "answers", "extractive", "extractive_em", "extractive_f1",
           "k": {"5": {"generated", "generated_em", "hit", "generated_f1"}, ...}}
(hit: an answer-bearing passage in the top k; F1 is SQuAD's token F1, None for regex answers, whose
set's F1 columns read "-", as do those of records written before F1 was.) A run with the answer memory
(`--with-memory`) adds "extractive_memory" and "extractive_memory_em" and the report a column of its
own: "extractive" is always the phrase model's own answer.
"""
from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402

from odqa.common.metrics.answers import NQ_OPEN  # noqa: E402
from odqa.common.metrics.retrieval import top_k_accuracy  # noqa: E402

COLUMNS = ("questions", "Top-k", "extractive EM", "generated EM", "only extractive right", "only generated right",
           "extractive F1", "generated F1")


MEMORY_COLUMN = "extractive + memory EM"
# NQ scored against NQ-open's own answers ("answers_raw"), as FiD's data scores it, beside DPR's tokenised ones
RAW_COLUMNS = ("extractive EM" + NQ_OPEN, "generated EM" + NQ_OPEN)
LEGEND = ("EM scores each question's \"answers\": DPR's, whose NQ answers are PTB-tokenised (\"May 18 , 2018\"); "
          "the (NQ-open answers) columns score NQ-open's own, which FiD's data and published EM use.")


def _mean_f1(values: list) -> float | None:
    return None if not values or None in values else 100.0 * sum(values) / len(values)


def table_rows(records: list[dict]) -> list[dict]:
    """One row per (dataset, k)."""
    rows = []
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    for name in datasets:
        recs = [r for r in records if r["dataset"] == name]
        for k in sorted({int(k) for r in recs for k in r["k"]}):
            per = [(r["extractive_em"], r["k"][str(k)]["generated_em"], r["k"][str(k)]["hit"]) for r in recs]
            n = len(per)
            rows.append({"dataset": name, "k": k, "questions": n,
                         "Top-k": 100.0 * sum(h for _, _, h in per) / n,
                         "extractive EM": 100.0 * sum(e for e, _, _ in per) / n,
                         "generated EM": 100.0 * sum(g for _, g, _ in per) / n,
                         "only extractive right": sum(e and not g for e, g, _ in per),
                         "only generated right": sum(g and not e for e, g, _ in per),
                         "extractive F1": _mean_f1([r.get("extractive_f1") for r in recs]),
                         "generated F1": _mean_f1([r["k"][str(k)].get("generated_f1") for r in recs]),
                         # the answer memory's help, where the run asked for it (`--with-memory`)
                         **({MEMORY_COLUMN: 100.0 * sum(r["extractive_memory_em"] for r in recs) / n}
                            if all("extractive_memory_em" in r for r in recs) else {}),
                         **(dict(zip(RAW_COLUMNS, (100.0 * sum(r["extractive_em_raw"] for r in recs) / n,
                                                   100.0 * sum(r["k"][str(k)]["generated_em_raw"] for r in recs) / n)))
                            if all("answers_raw" in r for r in recs) else {})})
    return rows


def markdown(rows: list[dict]) -> str:
    columns = COLUMNS + ((MEMORY_COLUMN,) if any(MEMORY_COLUMN in r for r in rows) else ()) + \
        (RAW_COLUMNS if any(RAW_COLUMNS[0] in r for r in rows) else ())
    lines = ["| dataset | k | " + " | ".join(columns) + " |", "|---|---:|" + "---:|" * len(columns)]
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else "-" if r.get(c) is None else str(r[c])
                 for c in columns]
        lines.append(f"| {r['dataset']} | {r['k']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + LEGEND if RAW_COLUMNS[0] in columns else "")


def plot_em(rows: list[dict], path: str | os.PathLike) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["dataset"] for r in rows):
        rs = [r for r in rows if r["dataset"] == name]
        ks = [r["k"] for r in rs]
        line, = ax.plot(ks, [r["generated EM"] for r in rs], marker="o", label=f"{name} generated (FiD)")
        ax.plot(ks, [r["extractive EM"] for r in rs], linestyle="--", color=line.get_color(), label=f"{name} extractive")
    ax.set_xlabel("k (passages read)")
    ax.set_ylabel("EM (%)")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(sorted({r["k"] for r in rows}), labels=[str(k) for k in sorted({r["k"] for r in rows})])
    ax.legend(fontsize=7)
    ax.set_title("Exact match by k")
    _save(fig, path)


def plot_topk(curves: dict[str, dict[str, list[list[bool]]]], path: str | os.PathLike, max_k: int) -> None:
    """curves[dataset][retriever] = per-question has_answer flags, best first."""
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    ks = list(range(1, max_k + 1))
    for ax, (name, runs) in zip(axes[0], curves.items()):
        for label, hits in runs.items():
            ax.plot(ks, [top_k_accuracy(hits, k) for k in ks], label=label)
        ax.set_title(name)
        ax.set_xlabel("k")
        ax.set_ylabel("Top-k accuracy (%)")
        ax.legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: str | os.PathLike) -> None:
    from odqa.common.io import atomic_path
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")    # the temporary name has no .png to go by
    plt.close(fig)


REPORT_FILES = ("report.json", "report.md", "em_by_k.png", "topk.png")   # what write_report writes


def write_report(records: list[dict], out_dir: Path, curves: dict | None = None, max_k: int = 100) -> list[dict]:
    from odqa.common.io import atomic_path, write_json
    rows = table_rows(records)
    write_json(out_dir / "report.json", {"rows": rows})
    with atomic_path(out_dir / "report.md") as tmp:
        tmp.write_text(markdown(rows) + "\n", encoding="utf-8")
    plot_em(rows, out_dir / "em_by_k.png")
    if curves:
        plot_topk(curves, out_dir / "topk.png", max_k)
    return rows
