"""T5X's Adafactor slots as paxlite writes them: which dim T5X's ``v_row`` keeps.

Oracle: T5X's ``Adafactor._factored_dims`` (``t5x/adafactor.py``), transcribed in numpy:
a 2-D parameter is factored over its two largest dims ``(second largest, largest)`` by
``np.argsort``; ``v_row`` drops the largest, ``v_col`` the second largest.
"""

import numpy as np
import pytest

from paxlite.formats.hf.layout import Layout
from paxlite.formats.t5x import model_dir
from paxlite.formats.t5x.checkpoint import t5x_row_axis
from praxis_lite.optim.factored_adafactor import FactoredMoment, FactorLayout


def _t5x_v_row_axis(shape):
    second_largest, _ = np.argsort(shape)[-2:]
    return int(second_largest)


@pytest.mark.parametrize("shape", [(512, 384), (384, 512), (32, 32), (768, 2048), (2048, 768)])
def test_the_axis_t5x_s_v_row_keeps(shape):
    assert t5x_row_axis(shape) == _t5x_v_row_axis(shape)


def test_a_kernel_whose_embed_dim_is_the_larger_swaps_our_factors_into_t5x_s_slots():
    """T5 1.1 small's query [E=512, N*H=384] shape, small: [E=6, N*H=4]. Ours keep 'embed'
    in v_row; T5X's v_row keeps the smaller dim, the heads."""
    v_row = np.arange(1.0, 7.0, dtype=np.float32)  # [E]
    v_col = np.arange(1.0, 5.0, dtype=np.float32).reshape(2, 2)  # [N, H]
    moment = FactoredMoment(v_row, v_col, FactorLayout((0,), (1, 2)))
    unused = np.zeros((1,), np.float32)
    slots = model_dir._t5x_slots(moment, Layout.CONV_HEADS_IN, 0, t5x_row_axis((6, 4)), unused)
    np.testing.assert_array_equal(slots["v_row"], v_col.reshape(-1))
    np.testing.assert_array_equal(slots["v_col"], v_row)
    assert slots["v"] is unused and slots["m"] is unused


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_an_interrupted_save_is_removed_and_the_job_s_other_folders_stay(where, tmp_path, request):
    """MODEL_DIR holds T5X's steps beside TensorBoard's runs and paxlite's input positions.
    A save killed mid-write (on a disk: orbax's ``checkpoint_9.orbax-checkpoint-tmp-*``; in a
    bucket: ``checkpoint_9/`` without ``commit_success.txt``) is removed at start; the other
    folders, which have no commit mark either, stay (a real GCS emulator for the bucket)."""
    from etils import epath

    from paxlite.checkpoints import train_checkpoints
    from tests.gcs import BUCKET

    if where == "bucket":
        request.getfixturevalue("emulator")
        job = epath.Path(f"gs://{BUCKET}/interrupted_{tmp_path.name}")
        unfinished = job / "checkpoint_9"
    else:
        job = epath.Path(tmp_path)
        unfinished = job / "checkpoint_9.orbax-checkpoint-tmp-1795820000"
    for path in (job / "train" / "events.out.tfevents.1", unfinished / "state" / "_METADATA"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    checkpointer = train_checkpoints.Checkpointer(
        job, max_to_keep=None, checkpoint_format=model_dir.T5xCheckpoints()
    )
    try:
        assert checkpointer.interrupted_steps == [9] and checkpointer.all_steps() == []
    finally:
        checkpointer.close()
    assert not unfinished.exists()
    assert (job / "train" / "events.out.tfevents.1").read_text() == "x"
