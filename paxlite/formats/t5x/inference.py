"""T5X's model functions on paxlite's model: predict, score and predict-with-aux over the
examples SeqIO's ``EncDecFeatureConverter`` makes, as seqio's ``Evaluator`` and T5X's
``infer`` call them.

Each function takes an enumerated ``tf.data.Dataset`` of ``(index, features)`` (features:
``encoder_input_tokens [L_in]``, ``decoder_target_tokens [L_t]``, ``decoder_input_tokens``,
``decoder_loss_weights``; ids, 0 is padding) and returns, in the dataset's order,
``(index, output)`` pairs as T5X's ``utils.get_infer_fn`` does:

- predict: the top decode's token ids ``[L_t]`` (an ending EOS kept, then 0s); up to
  ``L_t`` tokens, as T5X decodes up to the targets' length.
- score: the sum of the target tokens' log-probabilities under the model (float).
- predict_with_aux: the decodes and ``{"scores": [...]}``, each decode's score (beam
  search: T5X's length-normalized beam score; sampling: the sum of its tokens'
  log-probabilities under the distribution sampled from).

Batches of ``batch_size`` examples (the last one padded with all-zero rows, dropped from
the results) run on the job's mesh; in a multi-process job every process reads the same
dataset and passes its rows of each batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from paxlite.evaluation import decode_lib
from paxlite.runtime import partitioning
from paxlite.train import pure_steps
from praxis_lite.py_utils import NestedMap

Indexed = list[tuple[int, Any]]


class T5xModelFunctions:
    """The predict, score and predict-with-aux functions of a job's model with the
    parameters ``params`` (set before a call; on ``params_shardings``). Each function is
    compiled once per shape and kept for later calls.

    Args:
      job: the job (its task's model and decoder settings, mesh and batch sharding).
      params_shardings: the shardings of the model's parameters.
      batch_size: examples per call of the model (T5X's ``DatasetConfig.batch_size``).
    """

    def __init__(self, job: Any, params_shardings: Any, batch_size: int):
        self._task = job.task
        self.params: Any = None
        self._calls = 0  # Folded into the sampling key: each call samples afresh.
        self._batch_size = batch_size
        self._layout = job.batch_sharding
        replicated = NamedSharding(job.mesh, PartitionSpec())
        self._decoder = self._task.decoder_params()
        self._in_shardings = (params_shardings, self._layout, replicated)
        self._replicated = replicated
        self._decoders: dict[int, Any] = {}
        self._scorer = jax.jit(
            pure_steps.make_eval_step(self._task, per_example=True),
            in_shardings=(params_shardings, self._layout),
            out_shardings=replicated,
        )

    def predict(self, dataset: Any) -> Indexed:
        """``[(index, token ids)]`` of the top decode of each example."""
        return self.predict_with_aux(dataset)[0]

    def predict_with_aux(self, dataset: Any) -> tuple[Indexed, dict[str, list[float]]]:
        """``([(index, token ids)], {"scores": [score, ...]})`` in the dataset's order."""
        decodes: Indexed = []
        scores: list[float] = []
        key = jax.random.fold_in(jax.random.key(self._decoder.seed), self._calls)
        self._calls += 1
        for number, (indices, features) in enumerate(self._batches(dataset)):
            steps = int(features["decoder_target_tokens"].shape[1])
            out = self._decoded(_decode_batch(features), jax.random.fold_in(key, number), steps)
            tokens = np.asarray(out["tokens"])[: len(indices)]
            lengths = np.asarray(out["lengths"])[: len(indices)]
            for i, index in enumerate(indices):
                row = np.zeros(steps, np.int32)
                row[: lengths[i]] = tokens[i, : lengths[i]]
                decodes.append((int(index), row.tolist()))
            scores += [float(s) for s in np.asarray(out["scores"])[: len(indices)]]
        return decodes, {"scores": scores}

    def score(self, dataset: Any) -> Indexed:
        """``[(index, sum of the targets' log-probabilities)]``."""
        scored: Indexed = []
        for indices, features in self._batches(dataset):
            out = self._scorer(self.params, self._global(NestedMap(features)))
            per_example = np.asarray(jax.device_get(out["per_example"]["score"]))
            scored += [(int(index), float(per_example[i])) for i, index in enumerate(indices)]
        return scored

    def _batches(self, dataset: Any) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """``(indices [n], features)`` of ``batch_size`` examples each, padded to
        ``batch_size`` rows with zeros (``n`` real rows first)."""
        for indices, features in dataset.batch(self._batch_size).as_numpy_iterator():
            padded = {
                name: np.pad(
                    np.asarray(value, np.int32),
                    [(0, self._batch_size - len(indices))] + [(0, 0)] * (value.ndim - 1),
                )
                for name, value in features.items()
            }
            yield np.asarray(indices), padded

    def _decoded(self, batch: NestedMap, key: jax.Array, steps: int) -> dict[str, Any]:
        if steps not in self._decoders:
            self._decoders[steps] = jax.jit(
                decode_lib.make_decode_fn(self._task, self._decoder, steps),
                in_shardings=self._in_shardings,
                out_shardings=self._replicated,
            )
        out = self._decoders[steps](self.params, self._global(batch), key)
        return jax.device_get(out)

    def _global(self, batch: NestedMap) -> Any:
        """A whole batch (every process has it) as global arrays: each process passes its
        rows, padded so that the batch axes divide them."""
        hosts, index = partitioning.infeed_split(self._layout)
        ways = partitioning.batch_ways(self._layout)

        def rows(x: np.ndarray) -> np.ndarray:
            x = np.pad(x, [(0, -x.shape[0] % ways)] + [(0, 0)] * (x.ndim - 1))
            share = x.shape[0] // hosts
            return x[index * share : (index + 1) * share]

        return partitioning.to_global(jax.tree_util.tree_map(rows, batch), self._layout)


def _decode_batch(features: dict[str, np.ndarray]) -> NestedMap:
    """The decode contract's batch of an encoder-decoder (``input_*``, ``target_*``) from
    the converter's features: lengths count the non-padding ids (0 for a padding row)."""
    inputs, targets = features["encoder_input_tokens"], features["decoder_target_tokens"]
    return NestedMap(
        input_ids=inputs,
        input_lengths=np.sum(inputs != 0, axis=1).astype(np.int32),
        target_ids=targets,
        target_lengths=np.sum(targets != 0, axis=1).astype(np.int32),
    )
