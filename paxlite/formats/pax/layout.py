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
  [L, ...]``, and one scanning groups of layers (dense and mixture-of-experts)
  ``repeat/block/x_layers_j/... [L / g, ...]`` is Pax's ``repeat/sub/x_layers_j/...``;
  unscanned layers ``x_layers_i`` keep their names; a pipeline's ``[L, ...]``
  (or, circular, ``[R, L / R, ...]``) becomes, for each of the ``L / (S R)`` layers of a
  stage, ``pipeline/body/x_layers_j/... [S, ...]`` (``[R, S, ...]``): layer ``(r S + s)
  L / (S R) + j`` of the model.

* Values: praxis stores a LayerNorm's scale as its offset from 1 (``(1 + scale) x``); paxlite
  stores the scale itself.

:func:`to_pax` maps arrays (or ``jax.ShapeDtypeStruct`` leaves, under ``jax.eval_shape``).
The way back is per array: :func:`recipes` says, for each paxlite leaf, which Pax arrays hold
it and how (a transpose, an index into a stacked bias, the layers of a pipeline's stages), as
tensorstore index maps over those arrays, so a reader can fetch just one device's slice of a
leaf without reading (or building) the whole of it. :func:`pipeline_layout` finds ``S`` and
``R`` in a model config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import fiddle as fdl
import jax.numpy as jnp
import tensorstore as ts
from fiddle import daglish

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
    # praxis' TransformerFeedForwardMoe: the router [D, E], experts [E, D, F] and [E, F, D].
    "ff_layer/gate": ("ff_layer/gate", None),
    "ff_layer/wi_0": ("ff_layer/wi_0", None),
    "ff_layer/wi_gate_0": ("ff_layer/wi_gate_0", None),
    "ff_layer/wo_0": ("ff_layer/wo_0", None),
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
    """``'lm/transformer/x_layers_3/ff_layer/...'`` -> (``'lm/transformer/x_layers_3/'``, rest);
    a scanned group's layer: (``'lm/transformer/repeat/block/x_layers_1/'``, rest)."""
    if path.startswith(_SCANNED):
        rest = path[len(_SCANNED) :]
        head, _, tail = rest.partition("/")
        if head.startswith("x_layers_") and tail:
            return f"{_SCANNED}{head}/", tail
        return _SCANNED, rest
    parts = path.split("/")
    if len(parts) > 3 and parts[:2] == ["lm", "transformer"] and parts[2].startswith("x_layers_"):
        return "/".join(parts[:3]) + "/", "/".join(parts[3:])
    return "", path


def _combined(params: Mapping[str, Any], block: str) -> bool:
    return block + "self_attention/w_qkv" in params


def _leading_axes(block: str, num_stages: int, circular_repeat: int) -> int:
    """How many layer axes lead a stacked weight of ``block``: 0 unscanned, 1 or 2 stacked."""
    if not block.startswith(_SCANNED):
        return 0
    return 2 if num_stages > 1 and circular_repeat > 1 else 1


def _scanned_group(block: str, num_stages: int) -> str | None:
    """Pax's prefix of a scanned group's layer ``block`` (``repeat/sub/x_layers_j/``); None
    for other blocks.

    Raises:
      PaxLayoutError: a pipeline of groups (no Pax layout is built for it).
    """
    if not block.startswith(_SCANNED) or block == _SCANNED:
        return None
    if num_stages > 1:
        raise PaxLayoutError(
            f"{block}: a pipeline whose stages scan groups of layers has no Pax layout here."
        )
    return "lm/transformer/repeat/sub/" + block[len(_SCANNED) :]


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
    group = _scanned_group(block, num_stages)
    if group is not None:
        return {group + name: value}
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


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How one paxlite leaf is read from Pax arrays, as index maps (nothing is copied).

    Attributes:
      pax_names: the Pax arrays the leaf's elements live in (one, or a pipeline's
        ``x_layers_j`` for each layer ``j`` of a stage).
      lead: layer axes leading the leaf (0 unstacked, 1 ``[L, ...]``, 2 ``[R, L / R, ...]``).
      perm: the per-layer axes' permutation ``to_pax`` applies (None: none).
      take: the index into the q/k/v axis of a combined bias (None: not one).
      stages: ``S`` when the leaf's layers are spread over a pipeline's stages, else 1.
      scale_offset: the leaf is a LayerNorm scale, which praxis stores minus 1.
    """

    pax_names: tuple[str, ...]
    lead: int = 0
    perm: tuple[int, ...] | None = None
    take: int | None = None
    stages: int = 1
    scale_offset: bool = False

    def view(self, stores: Mapping[str, ts.TensorStore]) -> ts.TensorStore:
        """The leaf as a virtual tensorstore over ``stores`` (Pax name -> array): index it
        with a device's slice and read just that."""
        if self.stages > 1:
            view = self._pipeline_layers(stores)
        else:
            view = stores[self.pax_names[0]]
        if self.take is not None:
            view = view[(slice(None),) * self.lead + (self.take,)]
        if self.perm is not None:  # ts's transpose[p] moves axis i to p[i]: to_pax's inverse.
            view = view[ts.d[:].transpose[tuple(range(self.lead)) + self._lead_perm()]]
        return view

    def _lead_perm(self) -> tuple[int, ...]:
        return tuple(self.lead + p for p in self.perm or ())

    def _pipeline_layers(self, stores: Mapping[str, ts.TensorStore]) -> ts.TensorStore:
        """Layer ``(r S + s) k + j`` of the model is ``x_layers_j[(r,) s]`` (k per stage)."""
        per_stage = len(self.pax_names)
        layers = per_stage * self.stages

        def layer(prefix: tuple[int, ...], i: int) -> ts.TensorStore:
            return stores[self.pax_names[i % per_stage]][prefix + (i // per_stage,)]

        if self.lead == 1:
            return ts.stack([layer((), i) for i in range(layers)], axis=0)
        repeats = stores[self.pax_names[0]].shape[0]
        return ts.stack(
            [ts.stack([layer((r,), i) for i in range(layers)], axis=0) for r in range(repeats)],
            axis=0,
        )


def recipes(
    ours: Mapping[str, Any], num_stages: int = 1, circular_repeat: int = 1
) -> dict[str, Recipe]:
    """``{paxlite path: Recipe}`` for the leaves ``ours`` names (flat paths -> arrays or
    ``ShapeDtypeStruct``s), the inverse of :func:`to_pax` one leaf at a time.

    Raises:
      PaxLayoutError: a leaf with no counterpart in Pax's TransformerLm.
    """
    out = {}
    for path, value in ours.items():
        offset = path.endswith(SCALE_OFFSET_SUFFIXES)
        if path in MODEL_LEAVES:
            name, perm = MODEL_LEAVES[path]
            out[path] = Recipe((name,), perm=perm, scale_offset=offset)
            continue
        if path.startswith(_MLP):
            out[path] = Recipe((_PAX_MLP + path[len(_MLP) :],), scale_offset=offset)
            continue
        block, leaf = _split_block(path)
        take = None
        if leaf in _QKV_BIASES and _combined(ours, block):
            (name, perm), take = ("self_attention/combined_qkv/b", None), _QKV_BIASES.index(leaf)
        elif leaf in BLOCK_LEAVES:
            name, perm = BLOCK_LEAVES[leaf]
        else:
            raise PaxLayoutError(f"{path}: no counterpart in Pax's TransformerLm.")
        lead = _leading_axes(block, num_stages, circular_repeat)
        names, stages = _stacked_names(block, name, value.shape, num_stages, circular_repeat)
        out[path] = Recipe(names, lead, perm, take, stages, offset)
    return out


def _stacked_names(
    block: str, name: str, shape: tuple[int, ...], num_stages: int, repeats: int
) -> tuple[tuple[str, ...], int]:
    """``(Pax names, stages)`` of one weight of ``block`` (see :func:`_stack_entries`)."""
    group = _scanned_group(block, num_stages)
    if group is not None:
        return (group + name,), 1
    if block != _SCANNED:
        return (block + name,), 1
    if num_stages == 1:
        return ("lm/transformer/repeat/sub/x_layers_0/" + name,), 1
    layers_per_repeat = shape[0] if repeats == 1 else shape[1]
    per_stage = layers_per_repeat // num_stages
    return tuple(f"{_PIPELINED}x_layers_{j}/{name}" for j in range(per_stage)), num_stages


def pipeline_layout(model_cfg: Any) -> tuple[int, int]:
    """``(S, R)``: the stages and circular repeats of the pipeline in a model config
    (``(1, 1)`` without one)."""
    for value, _ in daglish.iterate(model_cfg):
        if isinstance(value, fdl.Buildable):
            args = value.__arguments__
            if "num_stages" in args:
                return int(args["num_stages"]), int(args.get("circular_repeat", 1))
    return 1, 1
