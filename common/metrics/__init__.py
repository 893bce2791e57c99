"""Answer metrics (EM, F1, regex EM), DPR's has_answer, and retrieval metrics."""
from odqa.common.metrics.answers import answer_em, exact_match, f1_score, normalize_answer, regex_match
from odqa.common.metrics.has_answer import TokenizedText, answer_spans, dpr_tokenize, has_answer
from odqa.common.metrics.retrieval import retrieval_metrics

__all__ = [
    "exact_match", "f1_score", "normalize_answer", "regex_match", "answer_em",
    "has_answer", "answer_spans", "dpr_tokenize", "TokenizedText", "retrieval_metrics",
]
