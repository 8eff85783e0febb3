"""Where modules moved when the packages were grouped by concern (after commit b9b3ecf), and
the layer fields renamed since: job directories written before name their configs' classes by
the old module paths and their fields by the old names (config.json is Fiddle JSON), and
:func:`praxis_lite.config.from_json` reads them through these tables.

Only names: nothing here imports the modules.
"""

#: Old module path -> the module that holds its names now.
MOVED_MODULES: dict[str, str] = {
    "praxis_lite.base_input": "praxis_lite.inputs.base_input",
    "praxis_lite.synthetic_input": "praxis_lite.inputs.synthetic_input",
    "praxis_lite.seqio_input": "praxis_lite.inputs.seqio_input",
    "praxis_lite.seqio_seq2seq": "praxis_lite.inputs.seqio_seq2seq",
    "praxis_lite.seqio_checks": "praxis_lite.inputs.seqio_checks",
    "praxis_lite.seqio_tasks": "praxis_lite.inputs.seqio_tasks",
    "praxis_lite.span_corruption": "praxis_lite.inputs.span_corruption",
    "praxis_lite.decoding": "praxis_lite.decoding.sampling",
    "praxis_lite.beam_search": "praxis_lite.decoding.beam_search",
    "praxis_lite.decode_cache": "praxis_lite.decoding.decode_cache",
    "praxis_lite.logits_processors": "praxis_lite.decoding.logits_processors",
    "praxis_lite.stop_strings": "praxis_lite.decoding.stop_strings",
    "praxis_lite.hf_tokenizer": "praxis_lite.tokenizers.hf_tokenizer",
    "praxis_lite.hf_chat": "praxis_lite.tokenizers.hf_chat",
    "praxis_lite.optimizers": "praxis_lite.optim.optimizers",
    "praxis_lite.schedules": "praxis_lite.optim.schedules",
    "praxis_lite.factored_adafactor": "praxis_lite.optim.factored_adafactor",
    "praxis_lite.model_flops": "praxis_lite.flops",
    "praxis_lite.t5_model": "praxis_lite.models.t5",
    "paxlite.flags": "paxlite.cli.flags",
    "paxlite.overrides": "paxlite.cli.overrides",
    "paxlite.exits": "paxlite.cli.exits",
    "paxlite.error_report": "paxlite.cli.error_report",
    "paxlite.pax_flags": "paxlite.cli.pax_flags",
    "paxlite.experiment_registry": "paxlite.experiments.registry",
    "paxlite.base_experiment": "paxlite.experiments.base_experiment",
    "paxlite.knob_types": "paxlite.experiments.knob_types",
    "paxlite.tasks_lib": "paxlite.experiments.tasks_lib",
    "paxlite.mesh_checks": "paxlite.runtime.mesh_checks",
    "paxlite.attention_choice": "paxlite.runtime.attention_choice",
    "paxlite.best_effort": "paxlite.runtime.best_effort",
    "paxlite.job": "paxlite.runtime.job",
    "paxlite.job_config": "paxlite.runtime.job_config",
    "paxlite.job_record": "paxlite.runtime.job_record",
    "paxlite.mesh": "paxlite.runtime.mesh",
    "paxlite.partitioning": "paxlite.runtime.partitioning",
    "paxlite.distributed": "paxlite.runtime.distributed",
    "paxlite.storage": "paxlite.runtime.storage",
    "paxlite.tpu_topology": "paxlite.runtime.tpu_topology",
    "paxlite.gpu_flags": "paxlite.runtime.gpu_flags",
    "paxlite.train_setup": "paxlite.train.train_setup",
    "paxlite.trainer_lib": "paxlite.train.pure_steps",
    "paxlite.train": "paxlite.train.train_loop",
    "paxlite.train_state": "paxlite.train.train_state",
    "paxlite.periodic_actions": "paxlite.train.periodic_actions",
    "paxlite.trainable": "paxlite.train.trainable",
    "paxlite.prefetch": "paxlite.train.prefetch",
    "paxlite.summaries": "paxlite.train.summaries",
    "paxlite.eval_lib": "paxlite.evaluation.eval_lib",
    "paxlite.eval_run": "paxlite.evaluation.eval_run",
    "paxlite.decode_lib": "paxlite.evaluation.decode_lib",
    "paxlite.decode_run": "paxlite.evaluation.decode_run",
    "paxlite.checkpoints": "paxlite.checkpoints.train_checkpoints",
    "paxlite.input_positions": "paxlite.checkpoints.input_positions",
    "paxlite.checkpoint_sources": "paxlite.checkpoints.checkpoint_sources",
    "paxlite.init_from": "paxlite.checkpoints.init_from",
    "paxlite.flops": "paxlite.perf.flops",
    "paxlite.mfu": "paxlite.perf.mfu",
    "paxlite.step_cost": "paxlite.perf.flops",
    "paxlite.perf.step_cost": "paxlite.perf.flops",
    "paxlite.bench": "paxlite.perf.bench",
    "paxlite.bench_report": "paxlite.perf.bench_report",
    "paxlite.bench_sweep": "paxlite.perf.bench_sweep",
    "paxlite.aot": "paxlite.perf.aot",
    "paxlite.profiling": "paxlite.perf.profiling",
    "paxlite.formats.hf_checkpoint": "paxlite.formats.hf.checkpoint",
    "paxlite.formats.hf_layout": "paxlite.formats.hf.layout",
    "paxlite.formats.hf_models": "paxlite.formats.hf.models",
    "paxlite.formats.pax_checkpoint": "paxlite.formats.pax.checkpoint",
    "paxlite.formats.pax_layout": "paxlite.formats.pax.layout",
    "paxlite.formats.peft_adapter": "paxlite.formats.peft.adapter",
    "paxlite.formats.t5x_checkpoint": "paxlite.formats.t5x.checkpoint",
    "paxlite.formats.t5x_layout": "paxlite.formats.t5x.layout",
    "paxlite.formats.t5x_gin": "paxlite.formats.t5x.gin",
    "paxlite.inference": "paxlite.pretrained.loading",
    "paxlite.pretrained": "paxlite.pretrained.pretrained_models",
    "paxlite.export": "paxlite.pretrained.export",
    "paxlite.adapters": "paxlite.pretrained.adapters",
}

#: ``praxis_lite.models`` became a package: each of its classes went to its own module.
MOVED_NAMES: dict[tuple[str, str], str] = {
    ("praxis_lite.models", "BaseModel"): "praxis_lite.models.base",
    ("praxis_lite.models", "LanguageModel"): "praxis_lite.models.lm",
    ("praxis_lite.models", "EncoderDecoderModel"): "praxis_lite.models.encoder_decoder",
    ("praxis_lite.models", "ClassificationMlpModel"): "praxis_lite.models.classification",
}

_ATTENTIONS = "praxis_lite.layers.attentions"
_ATTENTION = f"{_ATTENTIONS}.DotProductAttention"

#: Layer fields renamed or given an enum type: ``(class, field as config.json names it) ->
#: {value written then: (the field now, its value now)}``, a value now naming an enum member
#: as ``module:Enum.MEMBER``; None: the field is left out (today's default). A class's
#: subclasses follow its rules; a value not listed (of another type) is read as it is.
MOVED_FIELDS: dict[tuple[str, str], dict[object, tuple[str, str] | None]] = {
    (_ATTENTION, "per_dim_scale"): {
        True: ("query_scale", f"{_ATTENTIONS}:QueryScale.PER_DIM"),
        False: None,
    },
    (_ATTENTION, "query_scale_in_init"): {
        True: ("query_scale", f"{_ATTENTIONS}:QueryScale.IN_INIT"),
        False: None,
    },
    (_ATTENTION, "query_scale"): {None: None},  # 1 / sqrt(H): QueryScale.RSQRT_HEAD_DIM.
    (_ATTENTION, "attention_impl"): {
        impl: ("attention_impl", f"{_ATTENTIONS}:AttentionImpl.{impl.upper()}")
        for impl in ("einsum", "xla", "cudnn", "splash")
    },
}


def current_module(module: str, name: str) -> str:
    """The module that defines ``name`` now, for a reference written as ``module.name``
    (``module`` itself when it did not move)."""
    return MOVED_NAMES.get((module, name.split(".")[0]), MOVED_MODULES.get(module, module))
