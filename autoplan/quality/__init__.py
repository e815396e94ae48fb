"""Quality measurement: text data, perplexity, KL to the original and the user's prompt suite.

Public API:
    load_text_dataset(source=None, *, tokenizer, seq_len=256, n_calib=32, n_eval=8, seed=0) -> TextDataset
    load_suite(path, tokenizer, *, use_chat_template=None) -> PromptSuite
    QualityEvaluator(reference_model, eval_tokens, *, suite=None).evaluate(model) -> QualityResult
"""

from autoplan.lazy import lazy_exports

# each name's module is imported on first use (autoplan/lazy.py)
_EXPORTS = {
    "QualityEvaluator": "autoplan.quality.evaluator",
    "QualityResult": "autoplan.quality.evaluator",
    "ReferenceLogprobs": "autoplan.quality.metrics",
    "compare_pass": "autoplan.quality.metrics",
    "reference_pass": "autoplan.quality.metrics",
    "PromptSuite": "autoplan.quality.suite",
    "SuiteReference": "autoplan.quality.suite",
    "SuiteScore": "autoplan.quality.suite",
    "load_suite": "autoplan.quality.suite",
    "score_suite": "autoplan.quality.suite",
    "suite_reference": "autoplan.quality.suite",
    "TextDataset": "autoplan.quality.text",
    "is_eval_document": "autoplan.quality.text",
    "load_text_dataset": "autoplan.quality.text",
}
__getattr__ = lazy_exports(globals(), _EXPORTS)

__all__ = [
    "PromptSuite", "QualityEvaluator", "QualityResult", "ReferenceLogprobs", "SuiteReference",
    "SuiteScore", "TextDataset", "compare_pass", "is_eval_document", "load_suite",
    "load_text_dataset", "reference_pass", "score_suite", "suite_reference",
]
