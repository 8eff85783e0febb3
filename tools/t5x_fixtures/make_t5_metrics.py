"""Writes what T5's own metrics give for fixed texts, for paxlite's ``t5.evaluation.metrics``.

Runs in the T5X side venv (tools/t5x_fixtures/build_t5x_venv.sh installs ``t5==0.9.4``)::

    SIDE/venv/bin/python tools/t5x_fixtures/make_t5_metrics.py tests/fixtures/t5x/t5_metrics.json

``tests/paxlite/formats/t5x/t5_subset/test_metrics.py`` compares paxlite's metrics with it.
"""

import json
import sys

from t5.evaluation import metrics

TARGETS = [
    "the cat sat on the mat . it was warm .",
    "a dog barked at the moon",
    "hello world",
    "Das ist ein Haus.",
]
PREDICTIONS = [
    "the cat sat on a mat . it was hot .",
    "a dog barked at the sun",
    "hello world",
    "Das ist ein  Haus.",
]
#: Two reference streams (T5's multi-reference form): stream k holds each prediction's k-th.
MULTI = [
    ["the small cat sat on the warm mat", "a big dog barked at the full moon"],
    ["a small cat sat on a warm mat", "the big dog barked at the moon"],
]
MULTI_PREDICTIONS = ["the small cat sat on a warm mat", "a big dog barked at the moon"]


def main() -> None:
    found = {
        "targets": TARGETS,
        "predictions": PREDICTIONS,
        "bleu": metrics.bleu(TARGETS, PREDICTIONS),
        "bleu_13a": metrics.bleu(TARGETS, PREDICTIONS, tokenizer="13a"),
        "bleu_multi": {
            "targets": MULTI,
            "predictions": MULTI_PREDICTIONS,
            "value": metrics.bleu(MULTI, MULTI_PREDICTIONS),
        },
        "rouge": {k: float(v) for k, v in metrics.rouge(TARGETS, PREDICTIONS).items()},
        "accuracy": metrics.accuracy(TARGETS, PREDICTIONS),
        "sequence_accuracy": metrics.sequence_accuracy(TARGETS, PREDICTIONS),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(found, f, indent=1, default=float)
        f.write("\n")


if __name__ == "__main__":
    main()
