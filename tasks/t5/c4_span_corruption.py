"""T5's pretraining task on C4: span corruption (T5's ``c4_v220_span_corruption``).

The SeqIO task reads C4's documents from prepared TFDS files (``--tfds_data_dir``, as for
the C4 LMs; never downloaded), tokenizes their ``text`` with T5's SentencePiece model plus
100 extra ids (the sentinels), and corrupts spans (``praxis_lite.inputs.span_corruption``): with
``task_feature_lengths={'inputs': 512, 'targets': 114}`` every full example has 512 input
and 114 target tokens, EOS included. An experiment registers it in ``datasets()`` and
reads it with an encoder-decoder ``SeqIOInput``::

    register_c4_span_corruption_task(vocab_path=self.VOCAB_PATH)
    config_lib.Config(
        SeqIOInput,
        mixture_name=C4_SPAN_CORRUPTION_TASK_NAME,
        task_feature_lengths={"inputs": 512, "targets": 114},
        encoder_decoder=True,
        feature_converter_pack=True,
        model_vocab_size=self.VOCAB_SIZE,  # 32128 >= 32100 ids
        data_flag="--tfds_data_dir=DIR",
        ...
    )

T5 read ``c4/en:2.2.0`` (:data:`T5_C4_TFDS_NAME`); by default this task reads
``c4/en:3.0.1``, the version the C4 LMs' prepared files have (the English text differs a
little: 2.3.0 removed repeated lines within a page).
"""

from __future__ import annotations

import seqio

from praxis_lite.inputs.seqio_tasks import register_task_once
from praxis_lite.inputs.span_corruption import (
    MEAN_NOISE_SPAN_LENGTH,
    NOISE_DENSITY,
    span_corruption_preprocessors,
)
from tasks.lm.c4 import C4_TFDS_NAME

C4_SPAN_CORRUPTION_TASK_NAME = "c4_v220_span_corruption"
#: T5's default vocabulary (``t5.data.DEFAULT_SPM_PATH``): 32000 pieces, pad 0, EOS 1, UNK 2.
T5_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
#: T5's extra ids (``t5.data.DEFAULT_EXTRA_IDS``): the sentinels, ids 32099 down to 32000.
T5_EXTRA_IDS = 100
#: The C4 version T5's ``c4_v220_span_corruption`` read.
T5_C4_TFDS_NAME = "c4/en:2.2.0"


def t5_vocabulary(vocab_path: str | None, extra_ids: int = T5_EXTRA_IDS) -> seqio.Vocabulary:
    """The SentencePiece model at ``vocab_path`` (None: bytes) with ``extra_ids`` sentinels
    after its ids; reads no file until used."""
    if vocab_path is None:
        return seqio.ByteVocabulary(extra_ids=extra_ids)
    return seqio.SentencePieceVocabulary(vocab_path, extra_ids=extra_ids)


def register_c4_span_corruption_task(
    name: str = C4_SPAN_CORRUPTION_TASK_NAME,
    *,
    vocab_path: str | None = T5_VOCAB_PATH,
    extra_ids: int = T5_EXTRA_IDS,
    tfds_name: str = C4_TFDS_NAME,
    noise_density: float = NOISE_DENSITY,
    mean_noise_span_length: float = MEAN_NOISE_SPAN_LENGTH,
    shuffle_buffer_size: int = seqio.SHUFFLE_BUFFER_SIZE,
    concat_batch_size: int = 128,
) -> seqio.Task:
    """Registers the C4 span-corruption task (idempotent; new settings replace the old
    registration). Registering reads no file.

    Features 'inputs' and 'targets', both with ``t5_vocabulary(vocab_path, extra_ids)``
    and an EOS; ``shuffle_buffer_size`` is seqio's default, as T5's task has.
    """
    settings = dict(
        vocab_path=vocab_path,
        extra_ids=extra_ids,
        tfds_name=tfds_name,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
        shuffle_buffer_size=shuffle_buffer_size,
        concat_batch_size=concat_batch_size,
    )

    def make_task(task_name: str) -> seqio.Task:
        vocabulary = t5_vocabulary(vocab_path, extra_ids)
        return seqio.Task(
            task_name,
            source=seqio.TfdsDataSource(tfds_name=tfds_name),
            preprocessors=span_corruption_preprocessors(
                "text",
                noise_density=noise_density,
                mean_noise_span_length=mean_noise_span_length,
                concat_batch_size=concat_batch_size,
            ),
            output_features={
                key: seqio.Feature(vocabulary=vocabulary, add_eos=True)
                for key in ("inputs", "targets")
            },
            metric_fns=[],
            shuffle_buffer_size=shuffle_buffer_size,
        )

    return register_task_once(name, settings, make_task)
