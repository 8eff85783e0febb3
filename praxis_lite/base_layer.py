"""BaseLayer: a flax.linen Module whose dataclass fields are its hyperparameters.

Every layer in ``praxis_lite.layers`` derives from :class:`BaseLayer`, which gives:

* ``Layer.HParams.config(**fields)`` / ``.partial(**fields)``: Fiddle configs
  that catch typos (see :mod:`praxis_lite.config`);
* :meth:`BaseLayer.create_variable`: the one way to declare a weight (shape,
  initializer, dtype, logical axis names);
* :meth:`BaseLayer.constrain`: a logical-axis sharding constraint on an
  activation, a no-op without a mesh;
* :meth:`BaseLayer.create_child`: a child layer from a template, where one
  template config object used in several places is one layer (shared weights);
* :meth:`BaseLayer.add_summary` / :meth:`BaseLayer.add_aux_loss`: values
  recorded into the ``summaries`` / ``aux_loss`` flax collections; the train step
  adds the aux losses to the loss and reports every summary as a scalar metric
  (``summaries/<layer path>/<name>``, see :func:`summary_scalars`).

Parameter dtype (``dtype``) and compute dtype (``fprop_dtype``) are explicit on
every layer; :func:`praxis_lite.config.set_dtypes` sets them over a whole tree.
Train/eval mode is a call argument (``train=``) and randomness comes from the
RNG streams passed to ``apply`` (``rngs={'dropout': key}``); nothing is global.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp

from praxis_lite import config as config_lib
from praxis_lite.sharding import LogicalAxes

Initializer = Callable[..., jax.Array]
DType = Any

SUMMARIES = "summaries"
CACHE = "cache"  # The flax collection of decoding state (keys, values, paddings, index).
AUX_LOSS = "aux_loss"
PARAMS = "params"


class _HParamsFactory:
    """What ``Layer.HParams`` returns: makers of Fiddle configs for ``Layer``."""

    def __init__(self, layer_cls: type):
        self._layer_cls = layer_cls

    def config(self, **fields: Any) -> config_lib.Config:
        """A Fiddle config of the layer; unknown fields raise with a did-you-mean."""
        return config_lib.Config(self._layer_cls, **fields)

    def partial(self, **fields: Any) -> config_lib.Partial:
        """A Fiddle partial of the layer (build it, then call with the rest)."""
        return config_lib.Partial(self._layer_cls, **fields)

    def __repr__(self) -> str:
        return f"{self._layer_cls.__qualname__}.HParams"


class _HParamsDescriptor:
    def __get__(self, instance: Any, owner: type) -> _HParamsFactory:
        return _HParamsFactory(owner)


class BaseLayer(nn.Module):
    """Base of all layers.

    Attributes:
      dtype: dtype of the weights this layer creates (e.g. float32).
      fprop_dtype: dtype the layer computes in; inputs and weights are cast to it.
    """

    dtype: DType = dataclasses.field(default=jnp.float32, kw_only=True)
    fprop_dtype: DType = dataclasses.field(default=jnp.float32, kw_only=True)

    HParams = _HParamsDescriptor()

    def __post_init__(self) -> None:
        for field in config_lib.template_fields(type(self)):
            object.__setattr__(
                self, field.name, config_lib.wrap_template(getattr(self, field.name))
            )
        super().__post_init__()

    # --- weights ---------------------------------------------------------
    def create_variable(
        self,
        name: str,
        shape: Sequence[int],
        axes: LogicalAxes,
        init: Initializer,
        dtype: DType | None = None,
    ) -> jax.Array:
        """Declares (or fetches) a trainable weight.

        Args:
          name: the weight's name in the parameter tree.
          shape: its shape; one logical axis name per dimension in ``axes``.
          axes: logical axis names (``None`` = replicated dimension).
          init: a ``jax.nn.initializers`` function ``(key, shape, dtype)``.
          dtype: storage dtype; defaults to the layer's ``dtype``.

        Returns:
          The weight, cast to ``fprop_dtype``.
        """
        if len(axes) != len(shape):
            raise ValueError(
                f"{type(self).__name__}.{name}: {len(shape)}-D shape {tuple(shape)} needs "
                f"{len(shape)} logical axis names, got {axes}."
            )
        value = self.param(
            name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype or self.dtype
        )
        return value.astype(self.fprop_dtype)

    # --- activations -----------------------------------------------------
    def constrain(self, x: jax.Array, axes: LogicalAxes) -> jax.Array:
        """Constrains ``x``'s sharding by logical axis names (a no-op without a mesh)."""
        return nn.with_logical_constraint(x, tuple(axes))

    def to_fprop(self, x: jax.Array) -> jax.Array:
        """Casts a floating-point input to the compute dtype."""
        return x.astype(self.fprop_dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x

    def add_summary(self, name: str, value: jax.Array) -> None:
        """Records a scalar into the ``summaries`` collection (see :func:`summary_scalars`)."""
        self.sow(SUMMARIES, name, value)

    def add_aux_loss(self, name: str, value: jax.Array) -> None:
        """Records an auxiliary loss term (a scalar) into the ``aux_loss`` collection.

        Tasks add the sum of all recorded terms to the main loss.
        """
        self.sow(AUX_LOSS, name, value)

    # --- children --------------------------------------------------------
    def create_child(self, tpl: Any, **overrides: Any) -> BaseLayer | None:
        """Makes a child layer from a template (call from ``setup``; assign it).

        ``overrides`` are the fields the parent decides (e.g. ``input_dims``),
        set on a copy of the template. A template config object that appears in
        several places of the config tree is built once: every place that asks
        for it gets the same layer (one set of weights), and the places must
        agree on the overridden fields.

        Returns ``None`` for an absent optional template.
        """
        if tpl is None:
            return None
        holder = tpl if isinstance(tpl, config_lib.Template) else config_lib.Template(tpl)
        if not holder.shared:
            return self._build_child(holder, overrides)
        registry = self._shared_layers()
        child = registry.get(id(holder.value))
        if child is None:
            child = self._build_child(holder, overrides)
            registry[id(holder.value)] = child
            return child
        clashes = {
            k: (getattr(child, k), v) for k, v in overrides.items() if getattr(child, k) != v
        }
        if clashes:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' shares the {type(child).__name__} template "
                f"with another layer but needs different fields (field: (shared, wanted)) "
                f"{clashes}; use separate template configs if these layers should not "
                "share weights."
            )
        return child

    def stamp_child(self, tpl: Any, **overrides: Any) -> BaseLayer:
        """A fresh child from a deep copy of ``tpl`` (e.g. the i-th block of a stack)."""
        holder = tpl if isinstance(tpl, config_lib.Template) else config_lib.Template(tpl)
        return self._build_child(config_lib.Template(copy.deepcopy(holder.value)), overrides)

    def _build_child(self, holder: config_lib.Template, overrides: dict[str, Any]) -> BaseLayer:
        value = holder.value
        if isinstance(value, nn.Module):
            return value.clone(parent=self, name=None, **overrides)
        if not isinstance(value, fdl.Buildable):
            raise TypeError(
                f"{type(self).__name__}: a template must be a layer config "
                f"(e.g. Linear.HParams.config()), got {value!r}."
            )
        shared_ids = holder.shared_ids if holder.shared_ids else None
        try:
            return config_lib.instantiate(value, _shared_ids=shared_ids, **overrides)
        except TypeError as e:
            missing = re.findall(r"'(\w+)'", str(e).split("\n")[0])
            if "missing" not in str(e) or not missing:
                raise
            field = next(
                (
                    f.name
                    for f in config_lib.template_fields(type(self))
                    if getattr(self, f.name) is holder or getattr(self, f.name) == holder
                ),
                "<template>",
            )
            child_cls = value.__fn_or_cls__.__qualname__
            raise TypeError(
                f"{type(self).__qualname__} '{self.name}': its template {field} ({child_cls}) "
                f"has no value for field(s) {', '.join(missing)}. Set them on the config, "
                f"e.g. cfg.{field}.{missing[0]} = ..."
            ) from None

    def _shared_layers(self) -> dict[int, BaseLayer]:
        root: nn.Module = self
        while isinstance(root.parent, nn.Module):
            root = root.parent
        registry = root.__dict__.get("_praxis_shared_layers")
        if registry is None:
            registry = {}
            object.__setattr__(root, "_praxis_shared_layers", registry)
        return registry


def summary_scalars(summaries: dict[str, Any]) -> dict[str, jax.Array]:
    """Each recorded summary as one float32 scalar, keyed ``'<layer path>/<name>'``.

    A summary's value is the mean of what was recorded under its name: over the layers
    of a scanned stack (recorded ``[L]``), the microbatches of a pipeline, repeated
    calls, and the elements of a non-scalar value (record scalars).
    """
    values: dict[str, list[jax.Array]] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(summaries)[0]:
        name = "/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
        values.setdefault(name, []).append(jnp.mean(jnp.asarray(leaf, jnp.float32)))
    return {name: jnp.mean(jnp.stack(v)) for name, v in values.items()}


def summaries_and_aux_losses(mutables: dict[str, Any]) -> tuple[dict[str, Any], jax.Array]:
    """Splits the mutable collections returned by ``apply`` into summaries and a total aux loss."""
    summaries = mutables.get(SUMMARIES, {})
    aux_leaves = jax.tree_util.tree_leaves(mutables.get(AUX_LOSS, {}))
    aux_total = sum((jnp.sum(x) for x in aux_leaves), jnp.zeros((), jnp.float32))
    return summaries, aux_total
