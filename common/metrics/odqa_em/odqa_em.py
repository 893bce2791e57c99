"""odqa's answer metrics as a Hugging Face `evaluate` module, loadable by path without the hub:

    >>> import evaluate
    >>> em = evaluate.load("/path/to/odqa/common/metrics/odqa_em")
    >>> em.compute(predictions=["The Beatles"], references=[["Beatles", "the beatles band"]])
    {'exact_match': 100.0, 'f1': 100.0}

`references` holds each question's gold answers. With `config_name="regex"` the golds are regular
expressions (CuratedTREC) and `regex_mode` picks re.match (default, DrQA's anchoring), re.search or
re.fullmatch. Scores are percentages, averaged over questions, each the max over that question's golds.
"""
import datasets
import evaluate

from odqa.common.metrics.answers import exact_match, f1_score, regex_match

_CITATION = """\
@inproceedings{rajpurkar-etal-2016-squad,
  title = {{SQuAD}: 100,000+ Questions for Machine Comprehension of Text},
  author = {Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle = {EMNLP}, year = {2016}}
"""

_KWARGS = """
Args:
    predictions: list of predicted answers (strings).
    references: list of lists of gold answers (strings, or regexes with config_name="regex").
    regex_mode: "match", "search" or "fullmatch" (regex config only).
Returns:
    exact_match (and f1 for the default config), in percent.
"""


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _KWARGS)
class OdqaEm(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS,
            features=datasets.Features({
                "predictions": datasets.Value("string"),
                "references": datasets.Sequence(datasets.Value("string")),
            }),
        )

    def _compute(self, predictions, references, regex_mode="match"):
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
        n = max(len(predictions), 1)
        if self.config_name == "regex":
            em = sum(regex_match(p, r, mode=regex_mode) for p, r in zip(predictions, references))
            return {"exact_match": 100.0 * em / n}
        em = sum(exact_match(p, r) for p, r in zip(predictions, references))
        f1 = sum(f1_score(p, r) for p, r in zip(predictions, references))
        return {"exact_match": 100.0 * em / n, "f1": 100.0 * f1 / n}
