"""The measurements of ``benchmarks.gpu_mfu`` (imported once its XLA flags are set).

Each leg is an ``HfSyntheticLm`` experiment over a config.json written into ``<out>/configs``;
see ``benchmarks.gpu_mfu`` for what is measured and how batches are fitted.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import gc
import gzip
import json
import os
import pathlib
import statistics
import subprocess
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import jax
import jax.numpy as jnp

from benchmarks.gpu_mfu_report import GIB, markdown, percent
from benchmarks.paxlite_runner import PaxliteRunner, alternating_rounds
from benchmarks.plain_jax_lm import PlainRunner, Shape, init_params, make_train_step
from paxlite.experiments import base_experiment
from paxlite.perf import aot, bench, bench_report, flops, mfu
from paxlite.runtime import partitioning
from paxlite.runtime.job import Job, build_job
from paxlite.train import train_setup
from praxis_lite.flops import FlopsDefinition, LmShape
from tasks.lm.hf_synthetic import HfSyntheticLm

#: The fitted batch's share of the allocator's limit (the rest: fragmentation, cuDNN's
#: workspaces, what the extrapolation misses).
FIT_MARGIN = 0.97
#: How many times a fitted batch is checked with the compiler and fitted again.
FIT_CHECKS = 3
#: Warm-up steps before each timing (the first waits for compilation and autotuning).
WARMUP = 3
CPU_WARMUP = 2  # The plain step compiles twice: its first outputs are committed arrays.

_LLAMA = {
    "model_type": "llama",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
#: config.json of each leg's model: Llama-3.2-1B's and Llama-3-8B's published sizes.
CONFIGS = {
    "llama_1b": _LLAMA
    | {
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
    },
    "llama3_8b": _LLAMA
    | {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
}
#: ``--cpu``: the same families, tiny.
CPU_CONFIGS = {
    "llama_1b": CONFIGS["llama_1b"]
    | {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
    },
    "llama3_8b": CONFIGS["llama3_8b"]
    | {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
    },
}
LORA_KNOBS = {
    "LORA_RANK": 16,
    "LORA_ALPHA": 32.0,
    "LORA_TARGET_MODULES": "q_proj,k_proj,v_proj,o_proj",
    "LORA_BASE_DTYPE": "bfloat16",
}


@dataclasses.dataclass(frozen=True)
class Leg:
    """One paxlite measurement: a config.json and the knobs on top of it."""

    name: str
    config: str  # A key of CONFIGS.
    knobs: dict[str, Any]


def log(message: str) -> None:
    print(f"[gpu_mfu {time.strftime('%H:%M:%S')}] {message}", flush=True)


#: The legs, in the order they run.
LEGS = ("llama_1b", "llama3_8b_lora", "plain")


def run(args: argparse.Namespace, gpu_flags_added: list[str]) -> dict[str, Any]:
    """Every leg ``--legs`` names; writes the report after each (a run stopped by a time
    limit keeps the legs it finished). A leg that fails is recorded as its error and the
    next one runs. Returns the report."""
    out = pathlib.Path(args.out)
    configs = _write_configs(out / "configs", CPU_CONFIGS if args.cpu else CONFIGS)
    settings = _Settings.of(args, configs)
    legs = args.legs.split(",")
    report = _header(settings, gpu_flags_added)
    log(f"device {report['device']}; a step may take {size(settings.budget)}")
    for name in (leg for leg in LEGS if leg in legs):
        try:
            report[name] = _run_leg(name, settings, args)
        except (Exception, SystemExit) as e:  # noqa: BLE001 (the next leg still runs)
            report[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:500]}"}
            log(f"{name}: failed: {report[name]['error']}")
        write(report, args.out)
    return report


def _run_leg(name: str, settings: _Settings, args: argparse.Namespace) -> dict[str, Any]:
    memory_at_start = _device_bytes_in_use()
    if name == "llama_1b":
        leg_report = _bench_leg(settings, _llama_1b(settings), args.batch)
    elif name == "llama3_8b_lora":
        leg_report = _bench_leg(settings, _lora_leg(settings), args.lora_batch)
        _add_frozen_base_mfu(leg_report, settings)
    else:
        leg_report = _compare_with_plain(settings, args.rounds, args.profile)
    return leg_report | {"device_bytes_in_use_at_start": memory_at_start}


def _device_bytes_in_use() -> int | None:
    """What the device holds now, after a collection (None where it does not say)."""
    gc.collect()
    return (jax.devices()[0].memory_stats() or {}).get("bytes_in_use")


@dataclasses.dataclass(frozen=True)
class _Settings:
    configs: dict[str, pathlib.Path]  # Name -> the directory of its config.json.
    seq: int
    loss_chunks: int
    remat: str
    attention: str | None
    budget: int  # Bytes per device a step may take.
    max_batch: int
    steps: int
    warmup: int
    out: pathlib.Path

    @classmethod
    def of(cls, args: argparse.Namespace, configs: dict[str, pathlib.Path]) -> _Settings:
        return cls(
            configs=configs,
            seq=args.seq or (64 if args.cpu else 2048),
            loss_chunks=args.loss_chunks or (2 if args.cpu else 8),
            remat=args.remat,
            attention=None if args.cpu else args.attention,
            budget=_budget(args.memory_gib),
            max_batch=args.max_batch,
            steps=args.steps,
            warmup=CPU_WARMUP if args.cpu else WARMUP,
            out=pathlib.Path(args.out),
        )


def _budget(memory_gib: float | None) -> int:
    """Bytes a step may take on the device: ``--memory_gib``, else the allocator's limit
    (``XLA_PYTHON_CLIENT_MEM_FRACTION`` of the GPU), times FIT_MARGIN."""
    if memory_gib is not None:
        return int(memory_gib * GIB * FIT_MARGIN)
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
        raise SystemExit(
            "gpu_mfu: error: this device reports no memory limit (a CPU); pass --memory_gib."
        )
    return int(stats["bytes_limit"] * FIT_MARGIN)


def _write_configs(where: pathlib.Path, configs: dict[str, dict]) -> dict[str, pathlib.Path]:
    dirs = {}
    for name, fields in configs.items():
        dirs[name] = where / name
        dirs[name].mkdir(parents=True, exist_ok=True)
        (dirs[name] / "config.json").write_text(json.dumps(fields, indent=2))
    return dirs


def _llama_1b(settings: _Settings) -> Leg:
    return Leg("llama_1b", "llama_1b", _model_knobs(settings, "llama_1b"))


def _lora_leg(settings: _Settings) -> Leg:
    return Leg("llama3_8b_lora", "llama3_8b", _model_knobs(settings, "llama3_8b") | LORA_KNOBS)


def _model_knobs(settings: _Settings, config: str) -> dict[str, Any]:
    knobs = {
        "HF_MODEL": str(settings.configs[config]),
        "MAX_SEQ_LEN": settings.seq,
        "NUM_LOSS_CHUNKS": settings.loss_chunks,
        "CHECKPOINT_POLICY": settings.remat,
        "ICI_MESH_SHAPE": (1, 1, 1),
        "SUMMARY_INTERVAL_STEPS": 1_000_000,
    }
    if settings.attention:
        knobs["ATTENTION_IMPL"] = settings.attention
    return knobs


def experiment(leg: Leg, batch: int) -> HfSyntheticLm:
    """The leg's experiment at ``batch`` sequences, on one device (PERCORE_BATCH_SIZE is
    per device of all ``jax.device_count()``, so it is divided by that)."""
    knobs = leg.knobs | {"PERCORE_BATCH_SIZE": batch / jax.device_count()}
    return base_experiment.with_overrides(HfSyntheticLm, knobs)()


def _devices() -> list[jax.Device]:
    return jax.devices()[:1]


#: (leg name, batch) -> its compile figures: each is compiled once per run.
_COMPILED: dict[tuple[str, int], dict[str, Any]] = {}


def _compile_job(leg: Leg, batch: int) -> Job:
    """The leg's job at ``batch`` on one device, with stand-in inputs (nothing is read)."""
    exp = experiment(leg, batch)
    inputs = exp.stand_in_datasets(exp.datasets())
    return build_job(exp, exp.task(), inputs, pathlib.Path("/nonexistent"), _devices())


def paxlite_program_bytes(leg: Leg, batch: int) -> int:
    """Bytes per device of the leg's compiled step at ``batch`` (``paxlite.perf.aot``)."""
    if (leg.name, batch) not in _COMPILED:
        _COMPILED[leg.name, batch] = aot.compile_train_step(_compile_job(leg, batch))
    return _COMPILED[leg.name, batch]["program_bytes_per_device"]


def _plain_abstract(shape: Shape) -> tuple[Any, Any, Any]:
    """``(params, Adam state, jitted bf16 step)`` of the plain step, the first two abstract."""
    params = jax.eval_shape(lambda: init_params(shape))
    tx, step = make_train_step(shape, compute_dtype=jnp.bfloat16)
    return params, jax.eval_shape(tx.init, params), step


def plain_state_bytes(shape: Shape) -> int:
    """Bytes of the plain step's parameters and Adam state (one device holds them all)."""
    params, opt_state, _ = _plain_abstract(shape)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((params, opt_state)))


def plain_program_bytes(shape: Shape) -> int:
    """Bytes per device of the plain step's compiled program at ``shape``."""
    params, opt_state, step = _plain_abstract(shape)
    tokens = jax.ShapeDtypeStruct((shape.batch, shape.seq_len), jnp.int32)
    compiled = step.lower(params, opt_state, tokens, tokens).compile()
    return aot.program_memory(compiled)["program_bytes_per_device"]


def largest_batch(bytes_at: Callable[[int], int], budget: int, most: int, what: str) -> int:
    """The largest batch ``b <= most`` with ``bytes_at(b) <= budget``: extrapolated from
    batches 1 and 2, then checked with the compiler at the batch found and, while that is
    over the budget, extrapolated again from batch 1 and that batch (at most FIT_CHECKS
    times; on an H200 batches 1 and 2 of leg 1 differed by 0.74 GiB, but batch 131 took
    179.6 GiB, not the 115 GiB the first line gave: the buffers reused at small batches
    stop being reusable).

    Raises:
      SystemExit: batch 1 does not fit.
    """
    one, two = bytes_at(1), bytes_at(2)
    log(f"{what}: batch 1 needs {size(one)}, batch 2 {size(two)}; budget {size(budget)}")
    if one > budget:
        raise SystemExit(
            f"gpu_mfu: error: {what} needs {size(one)} at batch 1, over the budget of "
            f"{size(budget)}; use a shorter --seq (or, for paxlite's legs, more --remat)."
        )
    if two <= one:
        raise SystemExit(
            f"gpu_mfu: error: {what}: the compiler reports no more memory at batch 2 than at "
            "1, so no batch can be extrapolated; pass the batch (--batch, --lora_batch)."
        )
    batch = _extrapolated(one, 2, two, budget, most)
    for _ in range(FIT_CHECKS):
        if batch <= 2:
            return batch
        at_batch = bytes_at(batch)
        log(f"{what}: batch {batch} needs {size(at_batch)}")
        if at_batch <= budget:
            return batch
        batch = min(batch - 1, _extrapolated(one, batch, at_batch, budget, most))
    return batch


def _extrapolated(one: int, batch: int, at_batch: int, budget: int, most: int) -> int:
    """The batch at which the line through (1, ``one``) and (``batch``, ``at_batch``)
    bytes reaches ``budget``, in [1, most]."""
    per_row = max(1, (at_batch - one) // (batch - 1))
    return max(1, min(most, 1 + (budget - one) // per_row))


def _bench_leg(settings: _Settings, leg: Leg, batch: int | None) -> dict[str, Any]:
    """``--mode=benchmark``'s figures of the leg at its batch (given, or the largest that
    fits); a run out of memory steps down by an eighth, at most 3 times."""
    if batch is None:
        batch = largest_batch(
            lambda b: paxlite_program_bytes(leg, b),
            settings.budget,
            settings.max_batch,
            leg.name,
        )
    for attempt in range(4):
        gc.collect()  # A failed attempt's arrays go before the next one allocates.
        log(f"{leg.name}: benchmark at batch {batch} x {settings.seq}")
        try:
            figures = _benchmark(leg, batch, settings)
        except jax.errors.JaxRuntimeError as e:
            if "RESOURCE_EXHAUSTED" not in str(e) or attempt == 3 or batch == 1:
                raise
            batch = max(1, batch * 7 // 8)
            log(f"{leg.name}: out of memory; again at batch {batch}")
            continue
        log(
            f"{leg.name}: {figures['step_time_ms']:.1f} ms/step, "
            f"{figures['tokens_per_sec']:,.0f} tokens/s, "
            f"{figures['tflops_per_sec_per_device']:.4g} TFLOP/s, MFU {percent(figures['mfu'])}"
        )
        return {"batch": batch, "knobs": _printable(leg.knobs), "figures": figures}
    raise AssertionError("unreachable")


def _benchmark(leg: Leg, batch: int, settings: _Settings) -> dict[str, Any]:
    exp = experiment(leg, batch)
    job_dir = settings.out / "jobs" / leg.name
    job = build_job(exp, exp.task(), exp.datasets(), job_dir, _devices())
    try:
        timing = bench.BenchSettings(steps=settings.steps, warmup=settings.warmup)
        return bench.run_benchmark(job, timing)
    finally:
        del job
        gc.collect()


#: Our shape fields (``plain_jax_lm.Shape`` and ``praxis_lite.flops.LmShape`` share the names) ->
#: a Llama config.json's.
_LLAMA_SIZES = {
    "num_layers": "num_hidden_layers",
    "model_dims": "hidden_size",
    "hidden_dims": "intermediate_size",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "dims_per_head": "head_dim",
    "vocab_size": "vocab_size",
}


def _sizes(config: dict[str, Any]) -> dict[str, int]:
    return {ours: config[theirs] for ours, theirs in _LLAMA_SIZES.items()}


def _plain_shape(config: dict[str, Any], seq: int, batch: int) -> Shape:
    """The plain step at a Llama config's sizes (SwiGLU, RMSNorm, block remat)."""
    return Shape(**_sizes(config), seq_len=seq, batch=batch, gated=True, rms_norm=True, remat=True)


def lm_shape(config: dict[str, Any]) -> LmShape:
    """The FLOPs shape of a Llama config.json."""
    return LmShape(**_sizes(config), gated=True)


def _config(settings: _Settings, name: str) -> dict[str, Any]:
    return json.loads((settings.configs[name] / "config.json").read_text())


def paxlite_state_bytes(leg: Leg) -> int:
    """Bytes per device of the leg's parameters and optimizer state (traced, not compiled)."""
    job = _compile_job(leg, 1)
    with job.scope():
        state = train_setup.init_or_restore(job, train_setup.StateSource.ABSTRACT).state
    return partitioning.per_device_bytes(state.params) + partitioning.per_device_bytes(
        state.opt_state
    )


def _comparison_batch(settings: _Settings, leg: Leg, config: dict[str, Any]) -> int:
    """The largest batch at which both steps run with both states held on the device (they
    alternate): the plain step beside paxlite's state, and paxlite's beside the plain one's."""
    plain_fit = largest_batch(
        lambda b: plain_program_bytes(_plain_shape(config, settings.seq, b)),
        settings.budget - paxlite_state_bytes(leg),
        settings.max_batch,
        "plain step beside paxlite's state",
    )
    paxlite_fit = largest_batch(
        lambda b: paxlite_program_bytes(leg, b),
        settings.budget - plain_state_bytes(_plain_shape(config, settings.seq, 1)),
        settings.max_batch,
        "paxlite's step beside the plain state",
    )
    return min(plain_fit, paxlite_fit)


def _compare_with_plain(settings: _Settings, rounds: int, profile: bool) -> dict[str, Any]:
    """Leg 1's paxlite step and the plain step at the same batch, timed in alternating
    rounds (plain, paxlite, plain, ...) with both states held; tokens/s medians."""
    config = _config(settings, "llama_1b")
    leg = _llama_1b(settings)
    batch = _comparison_batch(settings, leg, config)
    log(f"paxlite vs plain: batch {batch} x {settings.seq}, {rounds} rounds")
    pax = PaxliteRunner(experiment(leg, batch))
    plain_input = pax.prefetcher()
    shape = _plain_shape(config, settings.seq, batch)
    plain = PlainRunner(shape, plain_input.next, compute_dtype=jnp.bfloat16)
    try:
        runners = {"plain": plain, "paxlite": pax}
        rates = alternating_rounds(runners, rounds, settings.steps, settings.warmup)
        if profile:
            with jax.profiler.trace(str(settings.out / "profile")):
                pax.run(3)
    finally:
        pax.close()
        plain_input.close()
    figures = _comparison_figures(rates, batch, shape, settings, config)
    if profile:
        figures["profile_top_ops"] = profile_summary(settings.out / "profile")
        figures["profile_batch"] = batch
    return figures


def _comparison_figures(
    rates: dict, batch: int, shape: Shape, settings: _Settings, config: dict[str, Any]
) -> dict[str, Any]:
    flops_per_token = lm_shape(config).flops_per_token(settings.seq, FlopsDefinition.CAUSAL)
    figures: dict[str, Any] = {"batch": batch, "plain_shape": dataclasses.asdict(shape)}
    for label in ("plain", "paxlite"):
        tokens_per_sec = statistics.median(rates[label])
        # One device; a token as the step: FLOPs per token at tokens/s.
        achieved = flops.achieved_flops(flops_per_token, tokens_per_sec, 1, _peak())
        figures[label] = {
            "tokens_per_sec": tokens_per_sec,
            "tokens_per_sec_rounds": rates[label],
            "tflops_per_sec_per_device": achieved.tflops_per_sec_per_device,
            "mfu": achieved.mfu,
        }
    figures["ratio"] = figures["paxlite"]["tokens_per_sec"] / figures["plain"]["tokens_per_sec"]
    log(
        f"paxlite vs plain at batch {batch}: paxlite {figures['paxlite']['tokens_per_sec']:,.0f}"
        f" tokens/s, plain {figures['plain']['tokens_per_sec']:,.0f}, ratio {figures['ratio']:.3f}"
    )
    return figures


def _kernel_lanes(events: list[dict]) -> set[tuple[Any, Any]] | None:
    """The (pid, tid) lanes of a device's kernels: its ``Stream #...`` lines (not its derived
    'XLA Modules' / 'XLA Ops' lines, which would count each kernel again); else its
    'XLA Ops' line; else all its lines; None (every lane) where the trace has no device."""
    devices = {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and str(e.get("args", {}).get("name", "")).startswith("/device:")
    }
    threads = {
        (e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") in devices
    }
    for prefix in ("Stream", "XLA Ops"):
        lanes = {lane for lane, name in threads.items() if name.startswith(prefix)}
        if lanes:
            return lanes
    return set(threads) or None


def profile_summary(trace_root: pathlib.Path, top: int = 15) -> list[dict[str, Any]]:
    """The ``top`` ops (GPU kernels on a GPU) by total time in the newest trace under
    ``trace_root`` (``*.trace.json.gz``): ``[{'name', 'ms', 'share'}]``, shares of the
    summed kernel time (of all timed events but Python frames where no device lane exists)."""
    traces = sorted(trace_root.glob("plugins/profile/*/*.trace.json.gz"))
    if not traces:
        return []
    with gzip.open(traces[-1], "rt") as f:
        events = json.load(f).get("traceEvents", [])
    kept = _kernel_lanes(events)
    totals: collections.Counter[str] = collections.Counter()
    for e in events:
        python_frame = e.get("name", "").startswith("$")  # The host's Python tracer.
        lane = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "X" and not python_frame and (kept is None or lane in kept):
            totals[e.get("name", "?")] += float(e.get("dur", 0.0))
    busy = sum(totals.values()) or 1.0
    return [
        {"name": name, "ms": us / 1000, "share": us / busy} for name, us in totals.most_common(top)
    ]


@functools.cache
def _peak() -> mfu.Peak:
    """The device's bfloat16 peak, as the benchmark takes it (``paxlite.perf.mfu``: the table's
    dense figure on a GPU; on a CPU a matmul timed now)."""
    return mfu.peak_for(jnp.bfloat16)


def _add_frozen_base_mfu(leg_report: dict[str, Any], settings: _Settings) -> None:
    """The LoRA leg's MFU counting no weight gradient for the frozen weights:
    ``(4 N + 6 L H Q T)`` per token (the causal count less ``2 N``)."""
    shape = lm_shape(_config(settings, "llama3_8b"))
    figures = leg_report["figures"]
    causal = shape.flops_per_token(settings.seq, FlopsDefinition.CAUSAL)
    frozen = causal - 2.0 * shape.matmul_params
    scale = frozen / causal
    leg_report["frozen_base"] = {
        "formula": "(4 * (N_blocks + D*V) + 6 * L*H*Q*T) * tokens",
        "tflops_per_sec_per_device": figures["tflops_per_sec_per_device"] * scale,
        "mfu": figures["mfu"] * scale if figures["mfu"] is not None else None,
    }


def _header(settings: _Settings, gpu_flags_added: list[str]) -> dict[str, Any]:
    device = jax.devices()[0]
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": device.device_kind,
        "platform": device.platform,
        "machine": bench_report.machine_description(),
        "versions": _versions(),
        "driver": _driver_version(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "gpu_flags_added": gpu_flags_added,
        "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "budget_bytes": settings.budget,
        "seq": settings.seq,
        "loss_chunks": settings.loss_chunks,
        "remat": settings.remat,
        "peak_tflops": _peak().tflops,
    }


def _versions() -> dict[str, str]:
    out = bench_report.versions()
    cuda = ("jax-cuda13-plugin", "jax-cuda12-plugin", "nvidia-cudnn-cu13", "nvidia-cudnn-cu12")
    for name in cuda:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def _driver_version() -> str | None:
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def _printable(knobs: dict[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in knobs.items()}


def size(num_bytes: float) -> str:
    """``12.34 GiB``, or ``5.6 MiB`` below a tenth of a GiB."""
    if num_bytes >= GIB / 10:
        return f"{num_bytes / GIB:.2f} GiB"
    return f"{num_bytes / 2**20:.1f} MiB"


def write(report: dict[str, Any], out: str) -> None:
    """``gpu_mfu.json`` and ``gpu_mfu.md`` into ``out``."""
    where = pathlib.Path(out)
    where.mkdir(parents=True, exist_ok=True)
    (where / "gpu_mfu.json").write_text(json.dumps(report, indent=2, default=str))
    (where / "gpu_mfu.md").write_text(markdown(report))
    log(f"wrote {where / 'gpu_mfu.json'} and {where / 'gpu_mfu.md'}")
