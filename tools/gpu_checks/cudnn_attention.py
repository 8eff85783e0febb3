"""cuDNN flash attention (``attention_kernels.cudnn_attention``) against the einsums, on an
NVIDIA GPU: outputs and gradients in bf16 with causal masks, key padding, sliding windows
and GQA, and the fwd+bwd time of the einsums, the XLA path and cuDNN in alternating rounds.

Run on a GPU machine from the repository root (needs only jax[cuda]; the kernels module is
loaded by path, so fiddle and the rest of paxlite need not be installed):

    python tools/gpu_checks/cudnn_attention.py [--out report.json]

Prints one line per case and writes the figures as JSON. CPU-only machines cannot run it
(cuDNN is not there); the CPU tests check what selects cuDNN and what it refuses.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)


def _kernels():
    """praxis_lite/layers/attention_kernels.py, imported alone (only jax needed)."""
    path = REPO / "praxis_lite" / "layers" / "attention_kernels.py"
    spec = importlib.util.spec_from_file_location("attention_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def einsum_attention(q, k, v, *, causal, window, key_lengths):
    """DotProductAttention.attend's einsums (q already scaled), float32 logits."""
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    q = q.reshape(b, t, kv, n // kv, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", q, k).astype(jnp.float32)
    behind = jnp.arange(t)[:, None] - jnp.arange(s)[None, :]
    mask = jnp.ones((t, s), bool)
    if causal:
        mask &= behind >= 0
    if window is not None:
        mask &= behind < window
    mask = mask[None, None, None]
    if key_lengths is not None:
        mask = mask & (jnp.arange(s)[None, :] < key_lengths[:, None])[:, None, None, None, :]
    probs = jax.nn.softmax(jnp.where(mask, logits, _NEG), axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, v).reshape(b, t, n, h)


def _inputs(b, t, n, kv, h, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = (jax.random.normal(keys[0], (b, t, n, h)) / np.sqrt(h)).astype(jnp.bfloat16)
    k = jax.random.normal(keys[1], (b, t, kv, h), jnp.bfloat16)
    v = jax.random.normal(keys[2], (b, t, kv, h), jnp.bfloat16)
    return q, k, v


def check(kernels, causal, window, padded) -> dict:
    """Max |cuDNN - einsum| of the outputs and of the q/k/v gradients, bf16."""
    b, t, n, kv, h = 2, 1024, 8, 2, 128
    q, k, v = _inputs(b, t, n, kv, h)
    lengths = jnp.asarray([t, t - 100], jnp.int32) if padded else None
    weights = jnp.ones((b, t, 1, 1), jnp.float32)
    if padded:
        real = jnp.arange(t)[None, :] < lengths[:, None]
        weights = real.astype(jnp.float32)[..., None, None]
    opts = dict(causal=causal, window=window, key_lengths=lengths)

    def loss(fn, q, k, v):
        return jnp.sum((fn(q, k, v, **opts).astype(jnp.float32) * weights) ** 2)

    results = {}
    for name, fn in (("einsum", einsum_attention), ("cudnn", kernels.cudnn_attention)):
        out = jax.jit(lambda q, k, v, fn=fn: fn(q, k, v, **opts))(q, k, v)
        grads = jax.jit(jax.grad(lambda q, k, v, fn=fn: loss(fn, q, k, v), (0, 1, 2)))(q, k, v)
        results[name] = (np.asarray(out.astype(jnp.float32) * weights), grads)
    (want, want_g), (got, got_g) = results["einsum"], results["cudnn"]
    report = {"case": dict(causal=causal, window=window, padded=padded, shape=[b, t, n, kv, h])}
    report["out_max_abs_diff"] = float(np.abs(got - want).max())
    report["out_scale"] = float(np.abs(want).max())
    for label, g, w in zip("qkv", got_g, want_g, strict=True):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        report[f"d{label}_max_abs_diff"] = float(np.abs(g - w).max())
        report[f"d{label}_scale"] = float(np.abs(w).max())
    return report


def timing(kernels, rounds=5) -> dict:
    """ms per fwd+bwd of the three paths at B 4, T 4096, N 16, K 8, H 128 (bf16, causal),
    measured in alternating rounds (median)."""
    q, k, v = _inputs(4, 4096, 16, 8, 128)
    causal = jnp.tril(jnp.ones((4096, 4096), bool))[None, None]
    paths = {
        "einsum": functools.partial(einsum_attention, causal=True, window=None, key_lengths=None),
        "xla": functools.partial(kernels.xla_attention, mask=causal, implementation="xla"),
        "cudnn": functools.partial(kernels.cudnn_attention, causal=True),
    }

    def summed(f, q, k, v):
        return jnp.sum(f(q, k, v).astype(jnp.float32) ** 2)

    steps = {
        name: jax.jit(jax.grad(functools.partial(summed, f), (0, 1, 2)))
        for name, f in paths.items()
    }
    for step in steps.values():
        jax.block_until_ready(step(q, k, v))
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(10):
                out = step(q, k, v)
            jax.block_until_ready(out)
            times[name].append((time.perf_counter() - start) / 10 * 1e3)
    return {name: round(float(np.median(t)), 3) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    kernels = _kernels()
    device = jax.devices()[0]
    report = {"device": device.device_kind, "jax": jax.__version__, "checks": []}
    cases = ((True, None, False), (True, None, True), (True, 256, False), (False, None, True))
    for causal, window, padded in cases:
        result = check(kernels, causal, window, padded)
        report["checks"].append(result)
        print(json.dumps(result))
    report["ms_fwd_bwd"] = timing(kernels)
    print(json.dumps(report["ms_fwd_bwd"]))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
