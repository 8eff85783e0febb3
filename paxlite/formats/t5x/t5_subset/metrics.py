"""``t5.evaluation.metrics``: T5's metrics for SeqIO tasks, as T5 0.9.4 computes them (0-100;
tests/fixtures/t5x/t5_metrics.json holds T5's own values).

``bleu`` is sacrebleu's corpus BLEU with T5's settings (exponential smoothing, 'intl'
tokenization by default, one or several references); ``rouge`` is rouge-score's
rouge1/rouge2/rougeLsum F-measure of the bootstrap median, sentences split at " . ". Both
need ``pip install "paxlite[t5]"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import numpy as np


class MissingMetricLibrary(ImportError):
    """A metric whose library is not installed (one line: which and how to install it)."""


def _library(module: str, package: str):  # noqa: ANN202 (a module)
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingMetricLibrary(
            f"T5's metric needs {package}, which is not installed; pip install "
            f'"paxlite[t5]" (or {package}).'
        ) from None


def bleu(
    targets: Sequence[str] | Sequence[Sequence[str]],
    predictions: Sequence[str],
    tokenizer: str = "intl",
) -> dict[str, float]:
    """Corpus BLEU of ``predictions`` against their references (a string each, or a list of
    references each), T5's settings."""
    sacrebleu = _library("sacrebleu", "sacrebleu")
    if targets and isinstance(targets[0], list):  # Several references: one stream each.
        references = [list(stream) for stream in targets]
    else:
        references = [list(targets)]
    score = sacrebleu.corpus_bleu(
        list(predictions),
        references,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize=tokenizer,
        use_effective_order=False,
    )
    return {"bleu": score.score}


def rouge(
    targets: Sequence[str],
    predictions: Sequence[str],
    score_keys: Sequence[str] = ("rouge1", "rouge2", "rougeLsum"),
    **scorer_options: Any,
) -> dict[str, float]:
    """rouge-score's F-measure (x100, bootstrap median) for each of ``score_keys``; ``" . "``
    ends a sentence (for rougeLsum), as in T5. ``scorer_options``: RougeScorer's."""
    rouge_scorer = _library("rouge_score.rouge_scorer", "rouge-score")
    scoring = _library("rouge_score.scoring", "rouge-score")
    scorer = rouge_scorer.RougeScorer(list(score_keys), **scorer_options)
    aggregator = scoring.BootstrapAggregator()
    for target, prediction in zip(targets, predictions, strict=True):
        aggregator.add_scores(
            scorer.score(target.replace(" . ", " .\n"), prediction.replace(" . ", " .\n"))
        )
    result = aggregator.aggregate()
    return {key: float(result[key].mid.fmeasure * 100) for key in score_keys}


def accuracy(targets: Sequence, predictions: Sequence) -> dict[str, float]:
    """Percentage of predictions equal to their targets."""
    return {
        "accuracy": 100
        * float(np.mean([t == p for t, p in zip(targets, predictions, strict=True)]))
    }


def sequence_accuracy(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of predicted sequences exactly equal to their targets."""
    same = [t == p for t, p in zip(targets, predictions, strict=True)]
    return {"sequence_accuracy": 100 * float(np.mean(same))}
