"""T5's translation prompt and i.i.d. denoising."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from paxlite.formats.t5x.t5_subset import preprocessors


def test_translate_writes_t5_s_prompt():
    ds = tf.data.Dataset.from_tensor_slices({"en": ["a house"], "de": ["ein Haus"]})
    (example,) = list(preprocessors.translate(ds, "en", "de").as_numpy_iterator())
    assert example == {"inputs": b"translate English to German: a house", "targets": b"ein Haus"}
    with pytest.raises(ValueError, match="language 'xx'"):
        preprocessors.translate(ds, "en", "xx")


def test_iid_denoising_is_t5_s_baseline_objective():
    """Pieces of the inputs' length; about 15% of the tokens are noise, each run of noise a
    sentinel in 'inputs' and each run of the rest a sentinel in 'targets'."""
    vocabulary = seqio.PassThroughVocabulary(size=1000)
    tokens = (np.arange(2000, dtype=np.int32) % 800) + 3  # Below the sentinels (999 down).
    ds = tf.data.Dataset.from_tensors({"targets": tokens})
    features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    with seqio.utils.map_seed_manager(7):
        out = list(preprocessors.iid_denoising(ds, {"inputs": 501}, features).as_numpy_iterator())
    assert len(out) == 4  # 2000 tokens in pieces of 500 (the inputs' 501 less the EOS).
    for example in out:
        kept = example["inputs"][example["inputs"] < 900]
        noise = example["targets"][example["targets"] < 900]
        assert len(kept) + len(noise) == 500
        assert 0.08 < len(noise) / 500 < 0.22
        sentinels = (example["inputs"] >= 900).sum(), (example["targets"] >= 900).sum()
        assert abs(int(sentinels[0]) - int(sentinels[1])) <= 1 and sentinels[0] > 10
