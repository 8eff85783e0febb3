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


def test_iid_denoising_replaces_about_the_density_of_tokens_by_the_first_sentinel():
    vocabulary = seqio.PassThroughVocabulary(size=1000)
    tokens = np.arange(3, 2003, dtype=np.int32) % 990 + 3
    ds = tf.data.Dataset.from_tensors({"targets": tokens})
    features = {"targets": seqio.Feature(vocabulary)}
    with seqio.utils.map_seed_manager(7):
        (example,) = list(preprocessors.iid_denoising(ds, None, features).as_numpy_iterator())
    np.testing.assert_array_equal(example["targets"], tokens)
    noised = example["inputs"] != tokens
    assert np.all(example["inputs"][noised] == 999)
    assert 0.12 < noised.mean() < 0.18
