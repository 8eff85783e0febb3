"""T5's tasks under T5's names: WMT from TFDS's WMT sets, C4 pretraining; the vocabulary
follows --t5_spm_path."""

import seqio

from paxlite.formats.t5x.t5_subset import data, mixtures, tasks


def test_t5_s_tasks_are_registered_with_their_sources_and_metrics():
    assert mixtures.tasks is tasks
    wmt = seqio.TaskRegistry.get("wmt_t2t_ende_v003")
    assert wmt.source.tfds_dataset.name == "wmt_t2t_translate/de-en:1.0.0"
    assert [fn.__name__ for fn in wmt.metric_fns] == ["bleu"]
    for name in ("wmt14_enfr_v003", "wmt19_ende_v003", "c4_v220_span_corruption"):
        assert name in seqio.TaskRegistry.names()
    c4 = seqio.TaskRegistry.get("c4_v220_iid_denoising")
    assert c4.source.tfds_dataset.name == tasks.C4_TFDS_NAME


def test_the_vocabulary_path_is_set_before_registering(tmp_path):
    local = str(tmp_path / "spm.model")
    try:
        data.set_spm_path(local)
        tasks.register()
        vocabulary = seqio.TaskRegistry.get("wmt14_enfr_v003").output_features["targets"].vocabulary
        assert vocabulary.sentencepiece_model_file == local
        assert vocabulary.extra_ids == data.DEFAULT_EXTRA_IDS
    finally:
        data.set_spm_path(None)
        tasks.register()
    default = seqio.TaskRegistry.get("wmt14_enfr_v003").output_features["targets"].vocabulary
    assert default.sentencepiece_model_file == data.DEFAULT_SPM_PATH
