"""T5's metrics: T5's settings over sacrebleu and rouge-score (0-100 scales)."""

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from paxlite.formats.t5x.t5_subset import metrics

TARGETS = ["the cat sat on the mat", "a dog barked at the moon", "hello world"]
PREDICTIONS = ["the cat sat on a mat", "a dog barked at the sun", "hello world"]


def test_bleu_is_sacrebleu_s_corpus_bleu_with_t5_s_settings():
    expected = sacrebleu.corpus_bleu(
        PREDICTIONS, [TARGETS], smooth_method="exp", smooth_value=0.0, tokenize="intl"
    ).score
    assert metrics.bleu(TARGETS, PREDICTIONS) == {"bleu": pytest.approx(expected)}
    assert metrics.bleu(TARGETS, TARGETS) == {"bleu": pytest.approx(100.0)}
    assert 0 < expected < 100


def test_rouge_is_the_f_measure_of_rouge_score():
    scores = metrics.rouge(TARGETS[:1], PREDICTIONS[:1])
    expected = rouge_scorer.RougeScorer(["rouge1"]).score(TARGETS[0], PREDICTIONS[0])
    assert scores["rouge1"] == pytest.approx(100 * expected["rouge1"].fmeasure)
    assert set(scores) == {"rouge1", "rouge2", "rougeLsum"}


def test_accuracies():
    assert metrics.accuracy([1, 2, 3, 4], [1, 2, 0, 4]) == {"accuracy": 75.0}
    assert metrics.sequence_accuracy(["a b ", "c"], ["a b", "d"]) == {"sequence_accuracy": 50.0}
