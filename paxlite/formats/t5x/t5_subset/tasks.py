"""``t5.data.tasks``: the tasks T5X's example gin files name, registered as T5 registers them.

The WMT translation tasks (``wmt_t2t_ende_v003``, ``wmt14_enfr_v003``, ``wmt15_enfr_v003``,
``wmt16_enro_v003``, ``wmt19_ende_v003``: TFDS's WMT sets, T5's prompt, scored by BLEU) and
C4's pretraining tasks (``c4_v220_span_corruption``, ``c4_v220_iid_denoising``: TFDS's
``c4/en:2.2.0``). All read TFDS's prepared files (``--tfds_data_dir``; never downloaded)
and tokenize with T5's vocabulary.
"""

from __future__ import annotations

import functools

import seqio

from paxlite.formats.t5x.t5_subset import data, metrics, preprocessors
from praxis_lite.inputs.seqio_tasks import register_task_once
from praxis_lite.inputs.span_corruption import span_corruption_preprocessors

#: T5's WMT tasks: name -> (TFDS name, source language, target language).
WMT_TASKS = {
    "wmt_t2t_ende_v003": ("wmt_t2t_translate/de-en:1.0.0", "en", "de"),
    "wmt14_enfr_v003": ("wmt14_translate/fr-en:1.0.0", "en", "fr"),
    "wmt15_enfr_v003": ("wmt15_translate/fr-en:1.0.0", "en", "fr"),
    "wmt16_enro_v003": ("wmt16_translate/ro-en:1.0.0", "en", "ro"),
    "wmt19_ende_v003": ("wmt19_translate/de-en:1.0.0", "en", "de"),
}
C4_TFDS_NAME = "c4/en:2.2.0"


def _wmt_task(name: str, tfds_name: str, source: str, target: str) -> seqio.Task:
    return seqio.Task(
        name,
        source=seqio.TfdsDataSource(tfds_name=tfds_name),
        preprocessors=[
            functools.partial(
                preprocessors.translate, source_language=source, target_language=target
            ),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=data.default_output_features(),
        metric_fns=[metrics.bleu],
    )


def _c4_task(name: str, denoising: str) -> seqio.Task:
    if denoising == "span_corruption":
        steps = span_corruption_preprocessors("text")
    else:
        steps = [
            functools.partial(
                seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}
            ),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            preprocessors.iid_denoising,
            seqio.preprocessors.append_eos_after_trim,
        ]
    return seqio.Task(
        name,
        source=seqio.TfdsDataSource(tfds_name=C4_TFDS_NAME),
        preprocessors=steps,
        output_features=data.default_output_features(),
        metric_fns=[],
    )


def register() -> None:
    """Registers T5's tasks (again: the same settings are a no-op; another vocabulary
    (``data.set_spm_path``) replaces them)."""
    for name, (tfds_name, source, target) in WMT_TASKS.items():
        settings = {"tfds_name": tfds_name, "languages": (source, target), "spm": data.spm_path()}
        register_task_once(
            name,
            settings,
            functools.partial(_wmt_task, tfds_name=tfds_name, source=source, target=target),
        )
    for name, denoising in (
        ("c4_v220_span_corruption", "span_corruption"),
        ("c4_v220_iid_denoising", "iid_denoising"),
    ):
        register_task_once(
            name,
            {"tfds_name": C4_TFDS_NAME, "t5_subset": denoising, "spm": data.spm_path()},
            functools.partial(_c4_task, denoising=denoising),
        )


register()
