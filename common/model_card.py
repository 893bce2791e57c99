"""The README.md model card that every checkpoint the training loop writes (`best/`, `last/`) carries,
as Hugging Face's `save_pretrained` users expect one: model-index metadata (base model, the validation
figures) in its front matter, and what trained it, on what data, for how many steps, in its text.

    Card(kind="FiD reader", command="train-reader", base_model="t5-base", train_files=[...],
         validation_file="...", task="question-answering")
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Card:
    kind: str                       # what the checkpoint is: "FiD reader", "phrase model", ...
    command: str                    # the odqa command that trains it
    base_model: str                 # the checkpoint it started from
    train_files: list[str] = field(default_factory=list)
    validation_file: str | None = None
    task: str = "question-answering"   # the model-index task type

    def text(self, name: str, info: dict) -> str:
        """The card of checkpoint `name` (best, last) with the loop's `info` ({"step", metric: value, ...})."""
        from huggingface_hub import EvalResult, ModelCardData
        step = info.get("step")
        figures = {k: v for k, v in info.items() if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)}
        results = [EvalResult(task_type=self.task, dataset_type="json", dataset_name=self.validation_file or "validation",
                              metric_type=metric, metric_value=value, metric_name=f"validation {metric}")
                   for metric, value in figures.items()]
        data = ModelCardData(base_model=self.base_model, library_name="transformers", tags=["odqa", self.command],
                             model_name=f"{self.kind} ({name})", eval_results=results or None)
        lines = [f"---\n{data.to_yaml()}\n---", "", f"# {self.kind} ({name})", "",
                 f"Trained with odqa's `{self.command}` from `{self.base_model}`.", "",
                 f"- checkpoint: `{name}`" + (f", step {step}" if step is not None else ""),
                 "- training data: " + (", ".join(f"`{f}`" for f in self.train_files) or "-"),
                 f"- validation data: `{self.validation_file}`" if self.validation_file else "- validation: none"]
        lines += [f"- validation {metric}: {value:g}" for metric, value in figures.items()]
        return "\n".join(lines) + "\n"
