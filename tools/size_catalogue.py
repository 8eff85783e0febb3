"""Compiles every registered experiment's train step for its TPU target and writes the table
docs/tpu-sizing.md (attention implementation, per-chip GiB by kind, fits or not, compile
seconds). Sections added to it by hand (a ``## `` heading other than Notes) are kept.

    python tools/size_catalogue.py                 # all, resuming; hours on 2 cores
    nohup python tools/size_catalogue.py > /tmp/sizing.log 2>&1 &
    python tools/size_catalogue.py --table-only    # rewrite the table from the results
    python tools/size_catalogue.py C4Spmd1B ...    # (re)compile these (short names work)

Each experiment compiles in its own process (a process's fake device count is fixed when
JAX starts), as ``paxlite --mode=compile --compile_topology=target`` would. Results are
appended to docs/tpu-sizing.jsonl as each finishes; a re-run skips experiments already
there, so the script can be stopped and restarted. Experiments whose train step is the same
program as one before (they differ only in loop knobs such as NUM_TRAIN_STEPS) are not
compiled again; their row names the one they share. Needs libtpu: pip install -e ".[tpu]".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "tpu-sizing.jsonl"
TABLE = REPO / "docs" / "tpu-sizing.md"
GIB = 2**30
#: Knobs that change the run, not the train step's program (a shared row, not a new compile).
LOOP_ONLY_KNOBS = frozenset(
    "NUM_TRAIN_STEPS CHECKPOINT_EVERY_N_STEPS CHECKPOINT_MAX_TO_KEEP SUMMARY_INTERVAL_STEPS "
    "EVAL_INTERVAL_STEPS TARGET_LOG_PPLX PROFILER_CAPTURE_STEP PROFILER_NUM_STEPS "
    "PROFILER_MIN_DURATION_SEC TPU_TARGET SEED TRAINING_SEED".split()
)
#: What was found out about an experiment whose row needs a word (findings, not figures).
_NOT_FOUND = (
    "Not explained yet: XLA's buffer report of the compile (compiler_options xla_dump_to) "
    "says which tensors take the chip's HBM; compare them with Pax's own program "
    "(tools/pax_fixtures/tpu_memory)."
)
#: What sizing the catalogue found and fixed, for the table's header.
FINDINGS = (
    "The fit follows the TPU compiler, not `memory_analysis()`: on a TPU its temp is the "
    "compiler's temporary allocation plus, a second time, the heap fragmentation already "
    "counted in it (Pax's own programs: 8.10 GiB for LmCloudSpmd32B, 7.93 for "
    "C4Spmd16BAdam32Replicas, 5.25 for LmCloudSpmd64B, the last two checked to the byte). "
    "Eleven rows it called too big are "
    "accepted by the compiler, which checks its own assignment against the chip's HBM.",
    "The layer-boundary activations [batch, length, model] are split over 'mdl', as praxis's "
    "training-optimized sharding splits them (a_bld): LmCloudSpmd32B kept two 20 GiB stacks "
    "of whole-model layer inputs and out_proj outputs.",
    "Pipelined LMs run the embeddings and softmax data-parallel over 'stage' too (paxml "
    "TransformerLmSpmdPipelineAdafactor's batch_dims): each chip computed 'stage' times "
    "Pax's logits. The pipeline's microbatch buffer is split like the layers' activations "
    "and read without XLA gathering all of it (192 GiB a chip for the GPT-3 2k pipeline).",
    "LmCloudSpmd LMs look up token embeddings by one-hot matmul, as Pax's sharding "
    "annotations set every LM given a mesh. (With the gather each chip of LmCloudSpmd512B "
    "held the whole batch's lookup, [4096, 1024, 320]; its total still grew, 31.49 -> 32.03 "
    "GiB, and LmCloudSpmd32B's 30.49 -> 30.87.)",
    "T5 1.1 / Flan-T5 train with T5X's Adafactor, factored by logical axes: its state is "
    "0.01 GiB a chip for the 11B (Adam's would be twice the parameters). FlanT5Xxl (11.1B, "
    "8-way model parallel, batch 128 of 512 + 114 tokens) also fits smaller v4 slices than "
    "its v4-64: 15.08 GiB a chip on a v4-32 (mesh 1, 2, 8), 18.05 on a v4-16 (1, 1, 8).",
)
#: A row compared with Pax's own train step, as the TPU compiler assigns it per chip.
_PAX_OWN = (
    "Pax's own train step (paxml 1.4.0's, lowered by jax 0.4.26 on the same topology and "
    "compiled by the same libtpu, tools/pax_fixtures/tpu_memory; "
    "tests/fixtures/pax/tpu_memory.json): {pax}; here {ours}."
)
NOTES: dict[str, str] = {
    "tasks.lm.lm_cloud.LmCloudTransformerAdam": (
        "Pax's pmap LM (32 layers, float32, no rematerialization, 16 x 1024 tokens per chip) "
        "keeps every layer's activations: 46.8 GiB a chip, more than a v4 chip offers. Its "
        "10-layer LimitSteps variant fits; the full one needs a chip with more HBM "
        "(--compile_topology=v5p-8: fits, 58.0 of 95.7 GiB)."
    ),
    "tasks.lm.c4.C4SpmdPipelineGpt3SmallAdam8Replicas": (
        "Pax's GPT-3 XL with its 512-sequence batch on 8 chips (64 per chip; Pax's README runs "
        "this model as C4SpmdPipelineGpt3SmallAdam64Replicas on a v4-128, 7.7 GiB here). Its "
        "softmax runs over 'stage' x 'data' = 4 ways and the vocabulary over 'mdl' = 2: float32 "
        "logits [128, 2048, 25600] = 25 GiB a chip, with their bfloat16 copy 12.5 GiB (praxis "
        "1.4's softmax computes them whole; no Pax experiment sets its chunk_size), more than a "
        "v4 chip offers. It needs a chip with more HBM (--compile_topology=v5p-16: fits, 50.9 "
        "of 95.7 GiB, compiled in 45 s)."
    ),
    "tasks.lm.lm_cloud.LmCloudSpmd32B": _PAX_OWN.format(
        pax="refused on this v4-128 too, needing 31.84 of 30.75 GiB a chip (its largest "
        "buffers are ours: three 5 GiB stacks of layer inputs, out_proj outputs and contexts)",
        ours="refused at 30.87 (with praxis's index lookup it was accepted at 30.49)",
    ),
    "tasks.lm.lm_cloud.LmCloudSpmd512B": _PAX_OWN.format(
        pax="refused on this v4-2048 too, needing 32.69 of 30.75 GiB a chip",
        ours="refused at 32.03",
    ),
    "tasks.lm.c4.C4Spmd16BAdam32Replicas": _PAX_OWN.format(
        pax="accepted, 26.21 GiB a chip", ours="25.61"
    ),
    "tasks.lm.lm_cloud.LmCloudSpmd64B": _PAX_OWN.format(
        pax="accepted, 24.51 GiB a chip", ours="25.85"
    ),
    "tasks.lm.c4_multislice.C4Spmd22BAdamMaxText": (
        "Pax's base of the 22B multi-slice runs (its subclasses set the mesh). On its own "
        "8-chip mesh the parameters and Adam's state alone are 21.9B x 12 bytes / 8 = "
        "30.7 GiB a chip: no 8-chip v4 slice holds it."
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="only these experiments (recompiled)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per compile")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # One compile, in its own process.
    args = parser.parse_args()
    if args.child:
        print(json.dumps(size_one(args.child)))
        return
    experiments = catalogue()
    results = read_results()
    if not args.table_only:
        wanted = [_full_name(n, experiments) for n in args.names] or list(experiments)
        for name in wanted:
            if name in results and "error" not in results[name] and not args.names:
                continue  # Sized before (errors are tried again).
            shared = {} if args.names else results  # Named ones are compiled afresh.
            results[name] = size_in_subprocess(name, experiments, shared, args.timeout)
            with RESULTS.open("a") as f:
                f.write(json.dumps(results[name]) + "\n")
            summary = _summary(results[name])
            results = read_results()  # Rows sharing its program follow the row just written.
            write_table(experiments, results)
            print(summary, flush=True)
    write_table(experiments, results)


def catalogue() -> dict[str, dict[str, Any]]:
    """Registered name -> {devices, fingerprint}, smallest meshes first."""
    from paxlite.experiments import registry
    from paxlite.experiments.base_experiment import knobs

    registry._import_package_modules("tasks")  # noqa: SLF001 (registers them all)
    rows = {}
    for name, cls in registry.get_all().items():
        values = {k: v for k, (_, v) in knobs(cls).items() if k not in LOOP_ONLY_KNOBS}
        methods = tuple(getattr(cls, m).__qualname__ for m in ("task", "datasets"))
        ici, dcn = cls.ICI_MESH_SHAPE, cls.DCN_MESH_SHAPE or (1,)
        devices = abs(math.prod(ici)) * math.prod(dcn)
        rows[name] = {"devices": devices, "fingerprint": repr((sorted(values.items()), methods))}
    return dict(sorted(rows.items(), key=lambda item: (item[1]["devices"], item[0])))


def size_in_subprocess(
    name: str, experiments: dict[str, Any], results: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One experiment's row: compiled in a child process, or shared with an earlier one."""
    fingerprint = experiments[name]["fingerprint"]
    for other, row in results.items():
        same = other != name and experiments.get(other, {}).get("fingerprint") == fingerprint
        if same and "same_as" not in row and "error" not in row:
            return {**row, "name": name, "same_as": other}
    start = time.perf_counter()
    command = [sys.executable, __file__, "--child", name]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"no answer within {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"name": name, "error": f"exit {done.returncode}: {last[:300]}"}
    return {**json.loads(lines[-1]), "wall_seconds": time.perf_counter() - start}


def size_one(name: str) -> dict[str, Any]:
    """Compiles ``name`` for its TPU target in this process; its figures (JSON-ready)."""
    import jax

    from paxlite.cli import overrides
    from paxlite.perf import aot
    from paxlite.runtime import distributed

    jax.config.update("jax_enable_compilation_cache", False)  # As aot.run does.
    experiment_cls = overrides.resolve_experiment_class(name, _data_overrides(name))
    target = aot.compile_target(experiment_cls, aot.EXPERIMENT_TARGET, None)
    distributed.use_fake_cpu_devices(aot.devices_needed(experiment_cls, target))
    experiment = experiment_cls()
    task_cfg, dataset_cfgs, _ = overrides.resolve_configs(experiment, [], [])
    job = None
    try:
        job = aot.build_compile_job(experiment, task_cfg, dataset_cfgs, target)
        figures = aot.compile_train_step(job, target)
    except Exception as e:  # noqa: BLE001 (recorded in the table, not raised)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        row = {"name": name, "target": target.describe(), "error": first[:300]}
        return row if job is None else {**row, "attention_impl": job.attention_impl.value}
    figures["fit"] = aot.fit_line(figures)  # With figures["attention_impl"], the layers' impl.
    keep = (str, int, float, dict, type(None))
    return {"name": name, **{k: v for k, v in figures.items() if isinstance(v, keep)}}


def _data_overrides(name: str) -> list[str]:
    """A stand-in text file for experiments that read the user's text files (their batch
    shapes do not depend on what the file holds)."""
    from paxlite.experiments import registry
    from paxlite.experiments.base_experiment import MISSING, knobs

    if knobs(registry.get(name)).get("TEXT_DATA_PATH", (None, None))[1] is not MISSING:
        return []
    path = pathlib.Path(tempfile.mkdtemp(prefix="size-catalogue-")) / "train.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 2000)
    return [f"TEXT_DATA_PATH={path}"]


def read_results() -> dict[str, dict[str, Any]]:
    """The rows written so far (the last row of a name wins)."""
    if not RESULTS.exists():
        return {}
    rows = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    results = {row["name"]: row for row in rows}
    for name, row in results.items():  # A shared row follows its program's latest row.
        source = results.get(row.get("same_as", ""))
        if source is not None and "same_as" not in source:
            results[name] = {**source, "name": name, "same_as": row["same_as"]}
    return results


def write_table(experiments: dict[str, Any], results: dict[str, Any]) -> None:
    """docs/tpu-sizing.md from the results (experiments not yet compiled are listed too)."""
    done = [results[n] for n in experiments if n in results]
    fits = sum(1 for r in done if str(r.get("fit", "")).startswith("fits"))
    compiled = [r for r in done if "compile_seconds" in r and "same_as" not in r]
    longest = max(compiled, key=lambda r: r["compile_seconds"], default=None)
    lines = [
        "# TPU sizing of the catalogue",
        "",
        "Every registered experiment's train step compiled for its TPU target by the TPU",
        "compiler (libtpu) on a 2-core CPU host, as `paxlite --exp=NAME --mode=compile",
        "--compile_topology=target` does; written by `tools/size_catalogue.py` (resumable).",
        "Figures are per chip, in GiB: parameters and optimizer state as sharded; XLA temp and",
        "the program's total (arguments + outputs - aliased + temp + code) from the compiled",
        "program's `memory_analysis`, an estimate; assigned: the HBM the TPU compiler's own",
        "buffer assignment places on a chip (arguments, outputs, temporaries), the figure it",
        "checks against the chip's HBM (it refuses a program over it, with that figure); HBM is",
        "what the TPU compiler offers a program on that chip. The fit follows the compiler:",
        "assigned (or its refusal's figure) against HBM. Attention: the implementation the",
        "train step's attention layers compiled with (`ATTENTION_IMPL`; unset, a TPU mesh takes",
        "the splash kernel); rows compiled before splash existed used the einsums.",
        *(_UNASSIGNED if any(_unassigned(r) for r in done) else ()),
        "A target is the experiment's `TPU_TARGET` (from its Pax name or Pax's README), else",
        "TPU v4 with one chip per mesh device.",
        "",
        "Found by sizing the catalogue (and fixed where ours differed from Pax):",
        "",
        *[f"- {finding}" for finding in FINDINGS],
        "",
        f"{len(done)} of {len(experiments)} experiments sized; {fits} fit their target."
        + (
            f" Longest compile: {longest['name'].rsplit('.', 1)[-1]}, "
            f"{longest['compile_seconds']:.0f} s."
            if longest
            else ""
        ),
        "",
        "| experiment | target | attention | params | optimizer | XLA temp | program | assigned "
        "| HBM | fits | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_table_row(name, results.get(name)) for name in experiments]
    notes = [
        f"- **{name.rsplit('.', 1)[-1]}**: {text}"
        for name in experiments
        if (text := _note(name, results.get(name)))
    ]
    if notes:
        lines += ["", "## Notes", "", *notes]
    if kept := _kept_sections():
        lines += ["", *kept]
    TABLE.write_text("\n".join(lines) + "\n")


def _kept_sections() -> list[str]:
    """The sections of docs/tpu-sizing.md written by hand (each ``## `` heading but the Notes
    this script writes, to the next one), kept at its end when the table is rewritten."""
    if not TABLE.exists():
        return []
    kept, keep = [], False
    for line in TABLE.read_text().splitlines():
        if line.startswith("## "):
            keep = line != "## Notes"
        if keep:
            kept.append(line)
    return "\n".join(kept).strip().splitlines()


_UNASSIGNED = (
    "A row without an assigned figure was sized before it was recorded; its fit is",
    "`memory_analysis`'s estimate, which is larger.",
)


def _unassigned(row: dict[str, Any]) -> bool:
    """A compiled row sized before the compiler's assignment was recorded."""
    return "program_bytes_per_device" in row and "hbm_assigned_bytes_per_chip" not in row


def _note(name: str, row: dict[str, Any] | None) -> str | None:
    """What was found out about a row: NOTES, or for a row that does not fit, its likely cause
    (or that it is not found)."""
    if name in NOTES:
        return NOTES[name]
    if row is None or "error" in row or str(row.get("fit", "")).startswith("fits"):
        return None
    if "same_as" in row:
        return f"as {row['same_as'].rsplit('.', 1)[-1]}."
    return _NOT_FOUND


def _table_row(name: str, row: dict[str, Any] | None) -> str:
    short = name.removeprefix("tasks.lm.")
    if row is None:
        return f"| {short} | | | | | | | | | not yet compiled | |"
    if "error" in row:
        target, attention = row.get("target", ""), row.get("attention_impl", "")
        return f"| {short} | {target} | {attention} | | | | | | | error: {row['error']} | |"
    if "hbm_needed_bytes" in row:  # A refusal's figure is the compiler's assignment too.
        row = {**row, "hbm_assigned_bytes_per_chip": row["hbm_needed_bytes"]}
    gib = {
        k: f"{row[k] / GIB:.2f}" if k in row else ""
        for k in (
            "params_bytes_per_device",
            "opt_state_bytes_per_device",
            "temp_bytes_per_device",
            "program_bytes_per_device",
            "hbm_assigned_bytes_per_chip",
            "hbm_bytes_per_chip",
        )
    }
    fit = row.get("fit") or ""
    if "same_as" in row:
        fit += f" (same program as {row['same_as'].rsplit('.', 1)[-1]})"
    seconds = f"{row['compile_seconds']:.0f}" if "compile_seconds" in row else ""
    return (
        f"| {short} | {row['target']} | {_attention(row)} | {gib['params_bytes_per_device']} | "
        f"{gib['opt_state_bytes_per_device']} | {gib['temp_bytes_per_device']} | "
        f"{gib['program_bytes_per_device']} | {gib['hbm_assigned_bytes_per_chip']} | "
        f"{gib['hbm_bytes_per_chip']} | {fit} | {seconds} |"
    )


def _attention(row: dict[str, Any]) -> str:
    """The attention implementation a row was compiled with (rows written before the report
    recorded it were compiled before the splash kernel existed: the einsums)."""
    return row.get("attention_impl", "einsum")


def _full_name(name: str, experiments: dict[str, Any]) -> str:
    matches = [n for n in experiments if n == name or n.endswith("." + name)]
    if len(matches) != 1:
        sys.exit(f"size_catalogue: {name!r} matches {matches or 'no experiment'}")
    return matches[0]


def _summary(row: dict[str, Any]) -> str:
    verdict = row.get("error") or row.get("fit") or "?"
    return f"{row['name']}: {row.get('target', '')}: {verdict}"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
