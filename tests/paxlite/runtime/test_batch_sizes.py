"""Batch arithmetic, one pure function: Pax's rule (per-device batch x devices, whole), the split
over infeed hosts and over the data-parallel shards; the experiment's knob errors and the
trainer's input check say the same thing."""

from fractions import Fraction

import pytest

from paxlite.experiments.base_experiment import KnobError, with_overrides
from paxlite.runtime.batch_sizes import BatchSizeError, BatchSizes, batch_sizes
from tasks.lm.synthetic import LmSyntheticTiny


@pytest.mark.parametrize(
    "args, expected",
    [
        ((4, 8), BatchSizes(32, 32)),
        ((0.5, 8), BatchSizes(4, 4)),  # Fractional: devices that hold no rows.
        ((0.5, 8, 2), BatchSizes(4, 2)),
        ((Fraction(1, 3), 6, 1, 2), BatchSizes(2, 2)),  # Exact, as the trainer's check passes it.
        ((2, 4, 4, 8), BatchSizes(8, 2)),
    ],
)
def test_sizes(args, expected):
    assert batch_sizes(*args) == expected


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        ((0.3, 8), {}, "PERCORE_BATCH_SIZE=0.3 x 8 devices = 2.4 is not a positive whole batch"),
        ((0, 8), {}, "= 0 is not a positive whole batch"),
        ((1, 6, 4), {}, "Global batch 6 does not split over 4 hosts; change PERCORE_BATCH_SIZE."),
        (
            (Fraction(1, 2), 8, 1, 8),
            {"owner": "Input 'train': ", "data_axes": " of mesh axes ('data',)"},
            "Input 'train': global batch 4 is not divisible by the 8 data-parallel shards of "
            "mesh axes ('data',). Change PERCORE_BATCH_SIZE or the mesh shapes",
        ),
    ],
)
def test_errors_are_one_line_naming_the_numbers_and_the_knob(args, kwargs, message):
    with pytest.raises(BatchSizeError) as e:
        batch_sizes(*args, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_experiment_answers_with_the_same_rule_as_knob_errors():
    experiment = with_overrides(LmSyntheticTiny, {"PERCORE_BATCH_SIZE": 0.3})()
    with pytest.raises(KnobError) as e:
        experiment.global_batch_size(8)
    with pytest.raises(BatchSizeError) as same:
        batch_sizes(0.3, 8)
    assert str(e.value) == str(same.value)
    assert experiment.per_host_batch_size(10, 1) == 3
    assert experiment.infeed_batch_size(percore=0.5) == 4  # This process's 8 devices, 1 host.
