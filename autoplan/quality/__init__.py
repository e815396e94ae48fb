"""Quality measurement: text data, perplexity, KL to the original and the user's prompt suite.

Public API:
    load_text_dataset(source=None, *, tokenizer, seq_len=256, n_calib=32, n_eval=8, seed=0) -> TextDataset
    load_suite(path, tokenizer, *, use_chat_template=None) -> PromptSuite
    QualityEvaluator(reference_model, eval_tokens, *, suite=None).evaluate(model) -> QualityResult
"""

from autoplan.quality.evaluator import QualityEvaluator, QualityResult
from autoplan.quality.metrics import ReferenceLogprobs, compare_pass, reference_pass
from autoplan.quality.suite import (
    PromptSuite,
    SuiteReference,
    SuiteScore,
    load_suite,
    score_suite,
    suite_reference,
)
from autoplan.quality.text import TextDataset, is_eval_document, load_text_dataset

__all__ = [
    "PromptSuite", "QualityEvaluator", "QualityResult", "ReferenceLogprobs", "SuiteReference",
    "SuiteScore", "TextDataset", "compare_pass", "is_eval_document", "load_suite",
    "load_text_dataset", "reference_pass", "score_suite", "suite_reference",
]
