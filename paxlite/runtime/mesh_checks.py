"""Checks of an experiment's mesh against its sizes, before any device is touched.

``jit`` splits arrays only evenly, and a pipeline needs its stages, microbatches
and 'stage' mesh axis to agree. A family's ``validate()`` states its sizes (the
knob that sets each, and the logical axis it is split along) and calls these;
each failure is a :class:`KnobError` naming the knob and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from paxlite.runtime.mesh import axis_sizes
from praxis_lite import sharding
from praxis_lite.sharding import BATCH, STAGES


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """An experiment's mesh as its knobs describe it.

    Attributes:
      owner: the experiment's name, for messages.
      sizes: mesh axis name -> devices on it (ICI x DCN).
      rules: the experiment's logical-axis rules (the first rule for an axis wins).
      axis_names: ``MESH_AXIS_NAMES``.
    """

    owner: str
    sizes: dict[str, int]
    rules: tuple[tuple[str, Any], ...]
    axis_names: tuple[str, ...]

    @classmethod
    def of(cls, experiment: BaseExperiment) -> MeshPlan:
        names = tuple(experiment.MESH_AXIS_NAMES)
        return cls(
            owner=type(experiment).__qualname__,
            sizes=axis_sizes(experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE, names),
            rules=tuple(sharding.with_defaults(experiment.logical_axis_rules())),
            axis_names=names,
        )

    @property
    def num_devices(self) -> int:
        return math.prod(self.sizes.values())

    def axes_of(self, logical: str) -> tuple[str, ...]:
        """The mesh axes (of more than one device) that the first rule for ``logical`` names."""
        first = dict(reversed(self.rules))  # The first rule wins.
        mesh_axes = first.get(logical) or ()
        mesh_axes = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        return tuple(a for a in mesh_axes if self.sizes.get(a, 1) > 1)

    def ways(self, logical: str) -> int:
        """Into how many parts ``logical`` is split."""
        return math.prod(self.sizes[a] for a in self.axes_of(logical))

    def check_even_split(self, sizes: dict[str, tuple[str, int]]) -> None:
        """Each ``{logical axis: (knob, size)}`` divides by the devices it is split over."""
        for logical, (knob, size) in sizes.items():
            ways = self.ways(logical)
            if size % ways:
                raise KnobError(
                    f"{self.owner}: {knob}={size} does not split evenly over the "
                    f"{ways} devices of mesh axes {self.axes_of(logical)} that LOGICAL_AXIS_RULES "
                    f"map '{logical}' onto (mesh {self.sizes}); make {knob} a multiple of {ways}, "
                    "or change ICI_MESH_SHAPE / DCN_MESH_SHAPE."
                )

    def check_no_stage_axis(self, repeat: int) -> None:
        """Without a pipeline: no devices on 'stage' and no circular repeats."""
        if self.sizes.get("stage", 1) > 1:
            raise KnobError(
                f"{self.owner}: the mesh has {self.sizes['stage']} devices on its 'stage' axis "
                f"but NUM_STAGES=1; set NUM_STAGES={self.sizes['stage']} to pipeline, or put "
                "those devices on another mesh axis."
            )
        if repeat > 1:
            raise KnobError(
                f"{self.owner}: CIRCULAR_REPEAT={repeat} needs a pipeline; set NUM_STAGES > 1 "
                "or CIRCULAR_REPEAT=1."
            )

    def check_stages(self, stages: int, repeat: int, num_layers: int) -> None:
        """A 'stage' mesh axis of ``stages`` devices that STAGES maps to; layers split evenly."""
        if "stage" not in self.axis_names:
            raise KnobError(
                f"{self.owner}: NUM_STAGES={stages} needs a 'stage' mesh axis, but "
                f"MESH_AXIS_NAMES = {self.axis_names}; set MESH_AXIS_NAMES=stage,replica,data,mdl "
                f"and ICI_MESH_SHAPE/DCN_MESH_SHAPE with {stages} devices on 'stage'."
            )
        if self.sizes["stage"] != stages:
            raise KnobError(
                f"{self.owner}: NUM_STAGES={stages} but the mesh has {self.sizes['stage']} "
                f"devices on its 'stage' axis (mesh {self.sizes}); make ICI_MESH_SHAPE x "
                f"DCN_MESH_SHAPE give 'stage' {stages} devices, or set "
                f"NUM_STAGES={self.sizes['stage']}."
            )
        if self.axes_of(STAGES) != ("stage",):
            raise KnobError(
                f"{self.owner}: LOGICAL_AXIS_RULES must map '{STAGES}' to the 'stage' mesh axis "
                f"to pipeline (its first rule for '{STAGES}' gives "
                f"{self.axes_of(STAGES) or None}); add ('{STAGES}', 'stage')."
            )
        if num_layers % (stages * repeat):
            raise KnobError(
                f"{self.owner}: NUM_LAYERS={num_layers} does not split into NUM_STAGES={stages} "
                f"x CIRCULAR_REPEAT={repeat} stages of equal depth; make NUM_LAYERS a multiple "
                f"of {stages * repeat}, or change NUM_STAGES / CIRCULAR_REPEAT."
            )

    def check_microbatches(
        self,
        global_batch: int,
        stages: int,
        repeat: int,
        microbatch_size: int | None,
        num_microbatches: int | None,
    ) -> None:
        """The global batch splits into microbatches, each over the data-parallel devices."""
        if microbatch_size is not None and num_microbatches is not None:
            raise KnobError(
                f"{self.owner}: set MICROBATCH_SIZE or NUM_MICROBATCHES, not both (got "
                f"{microbatch_size} and {num_microbatches})."
            )
        count, knob = self._microbatch_count(
            global_batch, stages, microbatch_size, num_microbatches
        )
        ways = self.ways(BATCH)
        if (global_batch // count) % ways:
            raise KnobError(
                f"{self.owner}: a microbatch of {global_batch // count} examples does not split "
                f"over the {ways} data-parallel devices of mesh axes {self.axes_of(BATCH)}; "
                f"change {knob} so each microbatch is a multiple of {ways}."
            )
        if repeat > 1 and count < stages:
            raise KnobError(
                f"{self.owner}: the circular schedule (CIRCULAR_REPEAT={repeat}) needs at least "
                f"NUM_STAGES={stages} microbatches, got {count}; lower {knob} or raise the batch."
            )

    def _microbatch_count(
        self, batch: int, stages: int, microbatch_size: int | None, num_microbatches: int | None
    ) -> tuple[int, str]:
        """``(microbatches, the knob that set them)``; raises if the batch does not split."""
        if microbatch_size is not None:
            if batch % microbatch_size:
                raise KnobError(
                    f"{self.owner}: the global batch {batch} (PERCORE_BATCH_SIZE x devices) does "
                    f"not split into microbatches of MICROBATCH_SIZE={microbatch_size}; make the "
                    "batch a multiple of MICROBATCH_SIZE."
                )
            return batch // microbatch_size, "MICROBATCH_SIZE"
        count = num_microbatches or stages
        if batch % count:
            raise KnobError(
                f"{self.owner}: the global batch {batch} (PERCORE_BATCH_SIZE x devices) does not "
                f"split into NUM_MICROBATCHES={count} microbatches; make the batch a multiple of "
                "NUM_MICROBATCHES (it defaults to NUM_STAGES)."
            )
        return count, "NUM_MICROBATCHES"
