"""``benchmarks.gpu_mfu`` on this CPU (its ``--cpu`` tiny shapes), and the pieces it stands on."""

import gzip
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import gpu_mfu_run
from benchmarks.plain_jax_lm import Shape, init_params, loss_fn
from tests import REPO, cpu_xla_flags

#: Runs the script as a GPU machine would, then lists the modules it must never import.
_RUN = """
import json, sys
from benchmarks import gpu_mfu
gpu_mfu.main(sys.argv[1:])
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"seqio", "tensorflow", "clu"})
print("HEAVY_IMPORTS", json.dumps(heavy))
"""


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_mfu")
    args = ["--cpu", "--out", str(out), "--batch", "2", "--lora_batch", "2"]
    # A budget where both comparison steps fit at batch 1 or 2 from their first two
    # compiles (paxlite's 2.3 MiB at batch 1, the plain step's 2.2, each ~0.5 MiB a row,
    # beside the other's 1 MiB of state): no further compile checks the extrapolation.
    args += ["--memory_gib", "0.0037", "--steps", "2", "--rounds", "1", "--profile"]
    result = subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        cwd=REPO,
        env={**os.environ, "XLA_FLAGS": cpu_xla_flags(1)},  # One GPU.
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    heavy = next(ln for ln in result.stdout.splitlines() if ln.startswith("HEAVY_IMPORTS"))
    return {
        "figures": json.loads((out / "gpu_mfu.json").read_text()),
        "markdown": (out / "gpu_mfu.md").read_text(),
        "heavy_imports": json.loads(heavy.split(" ", 1)[1]),
        "out": out,
    }


@pytest.mark.slow
def test_cpu_mode_runs_every_leg_end_to_end(report):
    figures, markdown, out = report["figures"], report["markdown"], report["out"]
    assert report["heavy_imports"] == []  # GPU machines have no SeqIO, TensorFlow or clu.
    assert not [leg for leg in gpu_mfu_run.LEGS if "error" in figures[leg]]
    for leg in ("llama_1b", "llama3_8b_lora"):
        leg_figures = figures[leg]["figures"]
        assert figures[leg]["batch"] == 2
        assert leg_figures["tokens_per_step"] == 2 * figures["seq"]
        assert leg_figures["tokens_per_sec"] > 0 and 0 < leg_figures["mfu"] < 1
        assert f"| {leg} (" in markdown
    assert figures["llama3_8b_lora"]["figures"]["model"]["description"].startswith("L=2 D=64 F=192")
    plain = figures["plain"]
    assert plain["batch"] >= 1  # Fitted beside paxlite's state.
    assert plain["ratio"] == pytest.approx(
        plain["paxlite"]["tokens_per_sec"] / plain["plain"]["tokens_per_sec"]
    )
    assert "paxlite / plain" in markdown
    assert list((out / "profile").rglob("*.trace.json.gz"))
    assert plain["profile_top_ops"] and not any(
        op["name"].startswith("$") for op in plain["profile_top_ops"]
    )


@pytest.mark.slow
def test_flops_shape_is_the_models_own_count(report):
    """The script's FLOPs shape of a config.json (the plain step's and the frozen-base
    count's) equals what paxlite's model counts for itself in the benchmark."""
    for leg, config in (("llama_1b", "llama_1b"), ("llama3_8b_lora", "llama3_8b")):
        figures = report["figures"][leg]["figures"]
        shape = gpu_mfu_run.lm_shape(gpu_mfu_run.CPU_CONFIGS[config])
        ours = shape.flops_per_step(figures["global_batch"], figures["seq_len"])
        assert ours == pytest.approx(figures["by_definition"]["causal"]["flops_per_step"])


def test_profile_summary_counts_stream_kernels_once(tmp_path):
    """On a GPU the device's derived 'XLA Modules' / 'XLA Ops' lines repeat the kernels of
    its 'Stream #' lines: only the streams count."""

    def meta(kind, pid, name, tid=None):
        return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}

    def span(pid, tid, name, dur):
        return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": 0, "dur": dur}

    events = [
        meta("process_name", 1, "/device:GPU:0"),
        meta("process_name", 2, "/host:CPU"),
        meta("thread_name", 1, "XLA Modules", 10),
        meta("thread_name", 1, "XLA Ops", 11),
        meta("thread_name", 1, "Stream #7(Compute)", 12),
        span(1, 10, "jit_train_step", 1000),
        span(1, 11, "fusion.1", 600),
        span(1, 12, "sm90_gemm", 600),
        span(1, 12, "cudnn_flash_fwd", 300),
        span(2, 1, "host_work", 5000),
    ]
    where = tmp_path / "plugins" / "profile" / "run"
    where.mkdir(parents=True)
    with gzip.open(where / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    top = gpu_mfu_run.profile_summary(tmp_path)
    assert [(op["name"], op["ms"]) for op in top] == [("sm90_gemm", 0.6), ("cudnn_flash_fwd", 0.3)]
    assert top[0]["share"] == pytest.approx(2 / 3)


@pytest.mark.slow
def test_lora_frozen_base_count(report):
    figures = report["figures"]["llama3_8b_lora"]
    shape = gpu_mfu_run.lm_shape(gpu_mfu_run.CPU_CONFIGS["llama3_8b"])
    seq = report["figures"]["seq"]
    d, v, layers = 64, 256, 2
    blocks = layers * (d * 16 * (2 * 4 + 2 * 2) + 3 * d * 192)
    attention = layers * 4 * 16 * seq
    expected = (4 * (blocks + d * v) + 6 * attention) / (6 * (blocks + d * v) + 6 * attention)
    assert shape.non_embedding_params == blocks
    assert figures["frozen_base"]["mfu"] == pytest.approx(figures["figures"]["mfu"] * expected)


def test_largest_batch_extrapolates_linearly():
    def bytes_at(batch):
        return 100 + 30 * batch

    assert gpu_mfu_run.largest_batch(bytes_at, 250, 64, "step") == 5  # 250 exactly.
    assert gpu_mfu_run.largest_batch(bytes_at, 279, 64, "step") == 5
    assert gpu_mfu_run.largest_batch(bytes_at, 10_000, 64, "step") == 64
    with pytest.raises(SystemExit, match="needs .* at batch 1, over the budget"):
        gpu_mfu_run.largest_batch(bytes_at, 120, 64, "step")


def test_largest_batch_checks_the_extrapolation_with_the_compiler():
    """As on an H200: batches 1 and 2 differ little (buffers reused), larger ones grow
    faster; the batch returned is one the compiler said fits."""
    asked = []

    def bytes_at(batch):
        asked.append(batch)
        return 1000 + 10 * batch if batch <= 2 else 1000 + 25 * batch

    batch = gpu_mfu_run.largest_batch(bytes_at, 2000, 256, "step")
    assert bytes_at(batch) <= 2000
    assert batch == 40  # 1000 + 25 * 40 = 2000; the first line said 100.
    assert asked[:3] == [1, 2, 100]


@pytest.mark.slow
def test_plain_grouped_kv_heads_equal_repeated_heads():
    """The plain step's GQA: each k/v head serves ``groups`` query heads in order, which
    is multi-head attention with every k/v head repeated ``groups`` times."""
    gqa = Shape(2, 32, 48, 4, 8, 50, 12, 2, num_kv_heads=2, gated=True, rms_norm=True)
    mha = Shape(2, 32, 48, 4, 8, 50, 12, 2, num_kv_heads=None, gated=True, rms_norm=True)
    params = jax.jit(init_params, static_argnums=(0, 1))(gqa, 3)
    qkv = params["blocks"]["qkv"]  # [L, D, 4 + 2 + 2, H]
    q, k, v = qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
    repeated = jnp.concatenate([q, jnp.repeat(k, 2, axis=2), jnp.repeat(v, 2, axis=2)], axis=2)
    mha_params = jax.tree.map(lambda x: x, params)
    mha_params["blocks"] = dict(params["blocks"], qkv=repeated)
    ids = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 12)), jnp.int32)
    labels = jnp.roll(ids, -1, axis=1)
    loss = jax.jit(loss_fn, static_argnums=3)  # As the step runs it (one compile a shape).
    np.testing.assert_allclose(
        loss(params, ids, labels, gqa), loss(mha_params, ids, labels, mha), rtol=1e-6
    )
