"""T5's metrics: paxlite's against the values T5 0.9.4 itself computed
(tests/fixtures/t5x/t5_metrics.json, from tools/t5x_fixtures/make_t5_metrics.py)."""

import json

import pytest

from paxlite.formats.t5x.t5_subset import metrics
from tests import FIXTURES

T5 = json.loads((FIXTURES / "t5x" / "t5_metrics.json").read_text())
TARGETS, PREDICTIONS = T5["targets"], T5["predictions"]


def test_bleu_is_t5_s():
    assert metrics.bleu(TARGETS, PREDICTIONS) == pytest.approx(T5["bleu"])
    assert metrics.bleu(TARGETS, PREDICTIONS, tokenizer="13a") == pytest.approx(T5["bleu_13a"])
    multi = T5["bleu_multi"]
    assert metrics.bleu(multi["targets"], multi["predictions"]) == pytest.approx(multi["value"])
    assert 0 < T5["bleu"]["bleu"] < 100


def test_rouge_is_t5_s():
    assert metrics.rouge(TARGETS, PREDICTIONS) == pytest.approx(T5["rouge"])


def test_accuracies_are_t5_s():
    assert metrics.accuracy(TARGETS, PREDICTIONS) == pytest.approx(T5["accuracy"])
    assert metrics.sequence_accuracy(TARGETS, PREDICTIONS) == pytest.approx(T5["sequence_accuracy"])
