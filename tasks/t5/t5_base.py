"""The encoder-decoder (T5) family base: knobs -> task config.

``T5Knobs`` declares the model's knobs once (T5X's sizes by their Pax-style names) and
builds the ``EncoderDecoderModel`` config through ``tasks.t5.t5_model``; ``T5Spmd`` adds
the optimizer, schedule and loop knob groups the decoder-only family uses. Leaves set
sizes, batch, mesh and ``datasets()``.
"""

from __future__ import annotations

import json
from typing import Any

import jax.numpy as jnp
from etils import epath

from paxlite.checkpoints.checkpoint_sources import CheckpointSourceError
from paxlite.experiments.base_experiment import BaseExperiment, KnobError
from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.formats.mtf import checkpoint as mtf_checkpoint
from paxlite.formats.t5x import gin as t5x_gin
from paxlite.pretrained import export
from paxlite.runtime import job_record, mesh_checks
from praxis_lite import config as config_lib
from praxis_lite.decoding import beam_search
from praxis_lite.layers.repeats import AutodiffCheckpointType
from praxis_lite.models.t5 import ACTIVATIONS, T5Shape, t5_model
from praxis_lite.sharding import EMBED, HEAD_DIM, HEADS, KV_HEADS, LAYERS, MLP, TABLE_EMBED, VOCAB
from tasks.lm.knob_groups import AdamKnobs, LoopKnobs, LrScheduleKnobs, check_at_least, knob_group

#: T5Shape's fields -> the knobs that set them (checked against a checkpoint's config).
_SHAPE_KNOBS = {
    "num_encoder_layers": "NUM_ENCODER_LAYERS",
    "num_decoder_layers": "NUM_DECODER_LAYERS",
    "model_dims": "MODEL_DIMS",
    "hidden_dims": "HIDDEN_DIMS",
    "num_heads": "NUM_HEADS",
    "dims_per_head": "DIMS_PER_HEAD",
    "vocab_size": "VOCAB_SIZE",
    "mlp_activations": "MLP_ACTIVATIONS",
    "logits_via_embedding": "LOGITS_VIA_EMBEDDING",
    "relative_buckets": "(T5's relative buckets, 32)",
    "relative_max_distance": "(T5's relative max distance, 128)",
}


@knob_group
class T5Knobs(BaseExperiment):
    """Model knobs of a T5 encoder-decoder (T5X's ``network.T5Config`` fields, named as the
    decoder-only knobs where those exist).

    Shape: NUM_ENCODER_LAYERS, NUM_DECODER_LAYERS, MODEL_DIMS (T5X's ``emb_dim``),
    HIDDEN_DIMS (``mlp_dim``), NUM_HEADS, DIMS_PER_HEAD (``head_dim``; None: MODEL_DIMS //
    NUM_HEADS), VOCAB_SIZE. Variant: MLP_ACTIVATIONS (T5X's ``mlp_activations``:
    ``gelu,linear`` for T5 1.1 and flan-t5, ``relu`` for T5 1.0), LOGITS_VIA_EMBEDDING
    (T5 1.0's tied logits). DROPOUT_PROB (T5X's ``dropout_rate``), Z_LOSS_WEIGHT,
    FPROP_DTYPE (compute; weights float32), USE_REPEATED_LAYER (scanned stacks) and
    CHECKPOINT_POLICY (remat inside the scan).
    """

    NUM_ENCODER_LAYERS: int
    NUM_DECODER_LAYERS: int
    MODEL_DIMS: int
    HIDDEN_DIMS: int
    NUM_HEADS: int
    DIMS_PER_HEAD: int | None = None
    VOCAB_SIZE: int = 32128
    MLP_ACTIVATIONS: tuple[str, ...] = ("gelu", "linear")
    LOGITS_VIA_EMBEDDING: bool = False
    DROPOUT_PROB: float = 0.0
    Z_LOSS_WEIGHT: float = 0.0
    FPROP_DTYPE: Any = jnp.bfloat16
    USE_REPEATED_LAYER: bool = True
    CHECKPOINT_POLICY: AutodiffCheckpointType = AutodiffCheckpointType.SAVE_NOTHING

    def validate(self) -> None:
        super().validate()
        check_at_least(
            self,
            1,
            "NUM_ENCODER_LAYERS",
            "NUM_DECODER_LAYERS",
            "MODEL_DIMS",
            "HIDDEN_DIMS",
            "NUM_HEADS",
            "VOCAB_SIZE",
        )
        name = type(self).__qualname__
        if self.DIMS_PER_HEAD is None and self.MODEL_DIMS % self.NUM_HEADS:
            raise KnobError(
                f"{name}: MODEL_DIMS={self.MODEL_DIMS} is not divisible by NUM_HEADS="
                f"{self.NUM_HEADS}; set DIMS_PER_HEAD (T5's heads are 64 dims) or change them."
            )
        if not 0.0 <= self.DROPOUT_PROB < 1.0:
            raise KnobError(f"{name}.DROPOUT_PROB = {self.DROPOUT_PROB}; it must be in [0, 1).")
        try:
            self.t5_shape()
        except ValueError as e:
            raise KnobError(f"{name}.MLP_ACTIVATIONS: {e} Known: {sorted(ACTIVATIONS)}.") from None
        self._check_init_from_config()

    def job_files(self) -> dict[str, str]:
        """INIT_FROM's config and tokenizer when it is a Hugging Face directory: the job
        exports as Hugging Face T5 (``paxlite-export``)."""
        if self.INIT_FROM and hf_checkpoint.is_hf_model_dir(epath.Path(self.INIT_FROM)):
            return export.kept_files(self.INIT_FROM)
        return {}

    def job_texts(self) -> dict[str, str]:
        """With a T5X INIT_FROM whose config.gin says which T5, or a Mesh TensorFlow one
        (its tensors do): Hugging Face's config.json and generation config of that T5, so
        the job exports as Hugging Face T5."""
        described = _described_shape(epath.Path(self.INIT_FROM)) if self.INIT_FROM else None
        if described is None or self.job_files():
            return {}
        config = hf_models.t5_config(described[1])
        generation = {
            k: config[k] for k in ("decoder_start_token_id", "eos_token_id", "pad_token_id")
        }
        kept = job_record.HF_MODEL_DIR
        return {
            f"{kept}/{hf_models.CONFIG_FILE}": json.dumps(config, indent=2) + "\n",
            f"{kept}/{hf_checkpoint.GENERATION_CONFIG_FILE}": json.dumps(generation) + "\n",
        }

    def _check_init_from_config(self) -> None:
        """KnobError listing each knob that disagrees with INIT_FROM's own config (a Hugging
        Face T5 directory's config.json, a T5X checkpoint's config.gin)."""
        if not self.INIT_FROM:
            return
        name = type(self).__qualname__
        try:
            described = _described_shape(epath.Path(self.INIT_FROM))
        except (hf_models.HfConfigError, t5x_gin.GinConfigError, CheckpointSourceError) as e:
            raise KnobError(f"{name}: INIT_FROM: {e}") from None
        if described is None:
            return
        config_file, theirs = described
        ours = self.t5_shape()
        differ = [
            f"{knob}={getattr(ours, field)!r} (its {getattr(theirs, field)!r})"
            for field, knob in _SHAPE_KNOBS.items()
            if getattr(ours, field) != getattr(theirs, field)
        ]
        if differ:
            raise KnobError(
                f"{name}: INIT_FROM={self.INIT_FROM} is a T5 whose {config_file} disagrees with "
                f"these knobs: {'; '.join(differ)}; set them to its values."
            )

    def head_dims(self) -> int:
        """DIMS_PER_HEAD, or MODEL_DIMS // NUM_HEADS."""
        return self.DIMS_PER_HEAD or self.MODEL_DIMS // self.NUM_HEADS

    def t5_shape(self) -> T5Shape:
        """The knobs' sizes and variant."""
        return T5Shape(
            num_encoder_layers=self.NUM_ENCODER_LAYERS,
            num_decoder_layers=self.NUM_DECODER_LAYERS,
            model_dims=self.MODEL_DIMS,
            hidden_dims=self.HIDDEN_DIMS,
            num_heads=self.NUM_HEADS,
            dims_per_head=self.head_dims(),
            vocab_size=self.VOCAB_SIZE,
            mlp_activations=tuple(self.MLP_ACTIVATIONS),
            logits_via_embedding=self.LOGITS_VIA_EMBEDDING,
            dropout_prob=self.DROPOUT_PROB,
        )

    def model(self) -> config_lib.Config:
        """The ``EncoderDecoderModel`` config of these knobs."""
        return t5_model(
            self.t5_shape(),
            fprop_dtype=self.FPROP_DTYPE,
            scanned=self.USE_REPEATED_LAYER,
            checkpoint_policy=self.CHECKPOINT_POLICY,
            z_loss_weight=self.Z_LOSS_WEIGHT,
        )


@knob_group
class T5Spmd(T5Knobs, AdamKnobs, LrScheduleKnobs, LoopKnobs):
    """Family knobs of T5 encoder-decoders: the model (``T5Knobs``), Adam, the schedule
    and the loop (as ``tasks.lm.lm_cloud.LmCloudSpmd``'s), validated against the mesh."""

    def validate(self) -> None:
        """Sizes are sane and weights split evenly on the mesh."""
        super().validate()
        check_t5_mesh(self)

    def task(self) -> Any:
        task = self.single_task(self.model(), self.learner(self.lr_schedule()))
        return with_t5x_beam_rules(task)


def with_t5x_beam_rules(task: Any) -> Any:
    """``task`` decoding by T5X's beam rules (``length_norm_alpha`` 0.6) when beams are
    asked for (``task.decoder.num_beams > 1``; T5X's WMT configs use 4)."""
    task.decoder.length_norm_alpha = beam_search.T5X_LENGTH_NORM_ALPHA
    return task


def check_t5_mesh(experiment: T5Knobs) -> None:
    """Raises KnobError unless the T5 knobs' weights split evenly on the experiment's mesh."""
    plan = mesh_checks.MeshPlan.of(experiment)
    sizes = {
        EMBED: ("MODEL_DIMS", experiment.MODEL_DIMS),
        TABLE_EMBED: ("MODEL_DIMS", experiment.MODEL_DIMS),
        MLP: ("HIDDEN_DIMS", experiment.HIDDEN_DIMS),
        HEADS: ("NUM_HEADS", experiment.NUM_HEADS),
        KV_HEADS: ("NUM_HEADS", experiment.NUM_HEADS),
        HEAD_DIM: ("DIMS_PER_HEAD", experiment.head_dims()),
        VOCAB: ("VOCAB_SIZE", experiment.VOCAB_SIZE),
    }
    plan.check_even_split(sizes)
    if experiment.USE_REPEATED_LAYER:  # Each stack's weights: [layers, ...].
        for knob in ("NUM_ENCODER_LAYERS", "NUM_DECODER_LAYERS"):
            plan.check_even_split({LAYERS: (knob, getattr(experiment, knob))})


def _described_shape(path: epath.Path) -> tuple[str, T5Shape] | None:
    """``(its config file, the T5 it describes)`` of a checkpoint path that says what it
    holds: a Hugging Face T5 directory's config.json, a T5X checkpoint's config.gin, a Mesh
    TensorFlow checkpoint's tensors (and operative_config.gin)."""
    if mtf_checkpoint.recognises(path):
        config_file, shape = mtf_checkpoint.shape_of_checkpoint(path)
        return config_file.name, shape
    if (path / hf_models.CONFIG_FILE).is_file():
        config = hf_models.HfConfig.load(path)
        if config.get("model_type") != "t5":
            return None
        return hf_models.CONFIG_FILE, hf_models.t5_shape_of(config)
    gin_file = t5x_gin.find(path)
    return None if gin_file is None else (t5x_gin.CONFIG_GIN, t5x_gin.t5_shape(gin_file))
