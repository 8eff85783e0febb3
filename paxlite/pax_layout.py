"""Pax's names and layouts for the parameters of paxlite's Transformer LM (praxis 1.4's).

The classification MLP's tree is Pax's under ``mlp_layers_0`` (paxlite's child ``mlp``).
A paxlite parameter tree, flattened to ``{"lm/softmax/emb_var": array, ...}``, becomes the
tree praxis's ``TransformerLm`` stores (``{"lm/softmax/logits_ffn/linear/w": array, ...}``),
the names Pax's checkpoints use (``mdl_vars.params.<dotted path>``). The rules:

* Leaves are renamed, and a few transposed: the shared softmax table ``[V, D]`` is Pax's
  ``logits_ffn/linear/w [D, V]``; the attention output ``w_post [N, H, D]`` is Pax's
  ``post/w [D, N, H]``; with one combined q/k/v weight, the three biases ``b_q, b_k, b_v
  [N, H]`` are Pax's ``combined_qkv/b [3, N, H]``.
* Stacks: a scanned stack ``repeat/block/... [L, ...]`` is Pax's ``repeat/sub/x_layers_0/...
  [L, ...]``; unscanned layers ``x_layers_i`` keep their names; a pipeline's ``[L, ...]``
  (or, circular, ``[R, L / R, ...]``) becomes, for each of the ``L / (S R)`` layers of a
  stage, ``pipeline/body/x_layers_j/... [S, ...]`` (``[R, S, ...]``): layer ``(r S + s)
  L / (S R) + j`` of the model.

* Values: praxis stores a LayerNorm's scale as its offset from 1 (``(1 + scale) x``); paxlite
  stores the scale itself.

:func:`to_pax` is a rearrangement of elements (a linear bijection), so :func:`from_pax` is its
transpose (``jax.linear_transpose``). Both work on arrays and on ``jax.ShapeDtypeStruct``
leaves (under ``jax.eval_shape``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

#: paxlite's leaf under a Transformer block -> (Pax's, permutation of the per-layer axes).
BLOCK_LEAVES: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "layer_norm/scale": ("layer_norm/scale", None),
    "layer_norm/bias": ("layer_norm/bias", None),
    "ff_layer/layer_norm/scale": ("ff_layer/layer_norm/scale", None),
    "ff_layer/layer_norm/bias": ("ff_layer/layer_norm/bias", None),
    "ff_layer/ffn_layer1/w": ("ff_layer/ffn_layer1/linear/w", None),
    "ff_layer/bias1/b": ("ff_layer/ffn_layer1/bias/b", None),
    "ff_layer/ffn_layer2/w": ("ff_layer/ffn_layer2/linear/w", None),
    "ff_layer/bias2/b": ("ff_layer/ffn_layer2/bias/b", None),
    "self_attention/w_qkv": ("self_attention/combined_qkv/w", None),
    "self_attention/w_q": ("self_attention/query/w", None),
    "self_attention/w_k": ("self_attention/key/w", None),
    "self_attention/w_v": ("self_attention/value/w", None),
    "self_attention/b_q": ("self_attention/query/b", None),
    "self_attention/b_k": ("self_attention/key/b", None),
    "self_attention/b_v": ("self_attention/value/b", None),
    "self_attention/w_post": ("self_attention/post/w", (2, 0, 1)),  # [N, H, D] -> [D, N, H]
    "self_attention/b_post": ("self_attention/post/b", None),
    "self_attention/per_dim_scale": ("self_attention/per_dim_scale/per_dim_scale", None),
}
#: paxlite's leaf outside the stack -> (Pax's, permutation).
MODEL_LEAVES: dict[str, tuple[str, tuple[int, ...] | None]] = {
    "lm/final_ln/scale": ("lm/final_ln/scale", None),
    "lm/final_ln/bias": ("lm/final_ln/bias", None),
    "lm/softmax/emb_var": ("lm/softmax/logits_ffn/linear/w", (1, 0)),  # [V, D] -> [D, V]
    "lm/softmax/b": ("lm/softmax/logits_ffn/bias/b", None),
    "lm/position_emb/emb_var": ("lm/position_emb/emb_var", None),
    # The classification MLP (Pax's ClassificationMLPModel): its softmax, as the LM's.
    "softmax/emb_var": ("softmax/logits_ffn/linear/w", (1, 0)),
    "softmax/b": ("softmax/logits_ffn/bias/b", None),
}
#: The classification MLP's block: paxlite's child ``mlp``, Pax's ``mlp_layers_0``.
_MLP, _PAX_MLP = "mlp/", "mlp_layers_0/"
_QKV_BIASES = ("self_attention/b_q", "self_attention/b_k", "self_attention/b_v")
_SCANNED, _PIPELINED = "lm/transformer/repeat/block/", "lm/transformer/pipeline/body/"


#: Leaves praxis stores as an offset from 1 (its LayerNorm's ``1 + scale``).
SCALE_OFFSET_SUFFIXES = ("layer_norm/scale", "final_ln/scale")


class PaxLayoutError(ValueError):
    """A parameter with no counterpart in Pax's TransformerLm, or a tree that is not Pax's."""


def from_pax(
    pax: Mapping[str, Any],
    ours: Mapping[str, Any],
    num_stages: int = 1,
    circular_repeat: int = 1,
) -> dict[str, Any]:
    """Pax's ``{path: array}`` -> paxlite's, for a model whose parameters ``ours`` (arrays or
    ``jax.ShapeDtypeStruct``, flat paxlite paths) describe; values follow paxlite's conventions.

    Raises:
      PaxLayoutError: Pax's tree lacks a parameter, has one more, or one of another shape
        (all of them named).
    """
    forward = lambda tree: to_pax(tree, num_stages, circular_repeat)  # noqa: E731
    abstract = {k: jax.ShapeDtypeStruct(v.shape, jnp.float32) for k, v in ours.items()}
    want = jax.eval_shape(forward, abstract)
    problems = [f"missing {k} {tuple(v.shape)}" for k, v in want.items() if k not in pax]
    problems += [f"unexpected {k}" for k in pax if k not in want]
    problems += [
        f"{k}: shape {tuple(pax[k].shape)}, this model's is {tuple(v.shape)}"
        for k, v in want.items()
        if k in pax and tuple(pax[k].shape) != tuple(v.shape)
    ]
    if problems:
        raise PaxLayoutError("; ".join(problems))
    (flat,) = jax.linear_transpose(forward, abstract)(
        {k: jnp.asarray(pax[k], jnp.float32) for k in want}
    )
    return {k: v + 1.0 if k.endswith(SCALE_OFFSET_SUFFIXES) else v for k, v in flat.items()}


def to_pax(
    params: Mapping[str, Any], num_stages: int = 1, circular_repeat: int = 1
) -> dict[str, Any]:
    """``{paxlite path: array}`` -> ``{Pax path: array}`` (see the module docstring).

    ``num_stages`` / ``circular_repeat``: the pipeline's ``S`` and ``R`` when the stack is
    pipelined (its weights then live under ``repeat/block`` like a scanned stack's).
    """
    out: dict[str, Any] = {}
    for path, value in params.items():
        if path in MODEL_LEAVES:
            name, perm = MODEL_LEAVES[path]
            out[name] = _permute(value, perm, 0)
            continue
        if path.startswith(_MLP):  # mlp/mlp_layers_i/{linear/w, bias/b}: Pax's names below it
            out[_PAX_MLP + path[len(_MLP) :]] = value
            continue
        block, leaf = _split_block(path)
        if leaf in _QKV_BIASES and _combined(params, block):
            continue  # Stacked into combined_qkv/b below.
        if leaf not in BLOCK_LEAVES:
            raise PaxLayoutError(f"{path}: no counterpart in Pax's TransformerLm.")
        name, perm = BLOCK_LEAVES[leaf]
        out.update(_stack_entries(block, name, value, perm, num_stages, circular_repeat))
    for block in {_split_block(p)[0] for p in params if _split_block(p)[1] in _QKV_BIASES}:
        if _combined(params, block):
            biases = [params[block + leaf] for leaf in _QKV_BIASES]
            lead = _leading_axes(block, num_stages, circular_repeat)
            stacked = jnp.stack(biases, axis=lead)
            out.update(
                _stack_entries(
                    block,
                    "self_attention/combined_qkv/b",
                    stacked,
                    None,
                    num_stages,
                    circular_repeat,
                )
            )
    return out


def _split_block(path: str) -> tuple[str, str]:
    """``'lm/transformer/x_layers_3/ff_layer/...'`` -> (``'lm/transformer/x_layers_3/'``, rest)."""
    if path.startswith(_SCANNED):
        return _SCANNED, path[len(_SCANNED) :]
    parts = path.split("/")
    if len(parts) > 3 and parts[:2] == ["lm", "transformer"] and parts[2].startswith("x_layers_"):
        return "/".join(parts[:3]) + "/", "/".join(parts[3:])
    return "", path


def _combined(params: Mapping[str, Any], block: str) -> bool:
    return block + "self_attention/w_qkv" in params


def _leading_axes(block: str, num_stages: int, circular_repeat: int) -> int:
    """How many layer axes lead a stacked weight of ``block``: 0 unscanned, 1 or 2 stacked."""
    if block != _SCANNED:
        return 0
    return 2 if num_stages > 1 and circular_repeat > 1 else 1


def _permute(value: Any, perm: tuple[int, ...] | None, lead: int) -> Any:
    """Transposes the per-layer axes (after ``lead`` layer axes) by ``perm``."""
    if perm is None:
        return value
    return jnp.transpose(value, tuple(range(lead)) + tuple(lead + p for p in perm))


def _stack_entries(
    block: str, name: str, value: Any, perm: Any, num_stages: int, repeats: int
) -> dict[str, Any]:
    """Pax's entries for one weight of ``block``: renamed, permuted, and split per stage layer."""
    lead = _leading_axes(block, num_stages, repeats)
    value = _permute(value, perm, lead)
    if block != _SCANNED:
        return {block + name: value}
    if num_stages == 1:
        return {"lm/transformer/repeat/sub/x_layers_0/" + name: value}
    if repeats == 1:  # [L, ...] -> [S, L / S, ...]: stage s runs layers s L/S .. (s+1) L/S - 1.
        per_stage = value.reshape((num_stages, -1) + value.shape[1:])
        return {
            f"{_PIPELINED}x_layers_{j}/{name}": per_stage[:, j] for j in range(per_stage.shape[1])
        }
    per_stage = value.reshape((repeats, num_stages, -1) + value.shape[2:])  # [R, S, L/(SR), ...]
    return {
        f"{_PIPELINED}x_layers_{j}/{name}": per_stage[:, :, j] for j in range(per_stage.shape[2])
    }
