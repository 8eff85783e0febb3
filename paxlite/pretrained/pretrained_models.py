"""Models with their weights on devices, as ``paxlite.pretrained.loading.from_pretrained`` returns
them: :class:`PretrainedLm` (decoder-only: ``logits``, ``generate``, chat) and
:class:`PretrainedSeq2Seq` (encoder-decoder: ``logits`` with ``decoder_input_ids``,
``encode``, ``generate``), over :class:`Pretrained` (``save_pretrained``, the batch padded to
the mesh, jitted programs kept per model).

Neither reads a model's field or class names: they ask the model's contract
(``praxis_lite.models.base.BaseModel``): ``decode`` for ``generate``, the ``logits`` and
``encode`` methods for the forward passes. Which one a model gets is its
``is_encoder_decoder`` (:func:`pretrained_class`).
"""

from __future__ import annotations

import abc
import dataclasses
import json
from collections.abc import Callable, Hashable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from etils import epath
from flax import traverse_util

from paxlite.formats.hf import checkpoint as hf_checkpoint
from paxlite.formats.hf import models as hf_models
from paxlite.runtime import partitioning
from praxis_lite.decoding import sampling, stop_strings
from praxis_lite.layers import lora
from praxis_lite.py_utils import NestedMap


class PretrainedError(ValueError):
    """The path holds no checkpoint paxlite can load, needs the experiment named, or the
    model cannot be saved as asked."""


@dataclasses.dataclass(frozen=True)
class HfOrigin:
    """Where a Hugging Face model came from: what ``save_pretrained`` writes back.

    Attributes:
      family: its family (names and layouts); config: its config.json's fields;
      generation_config: its generation_config.json's fields ({} when it had none).
    """

    family: hf_models.Family
    config: dict[str, Any]
    generation_config: dict[str, Any]


@dataclasses.dataclass
class Pretrained(abc.ABC):
    """A model with its weights on devices: what every kind of model ``from_pretrained``
    returns shares (a decoder-only :class:`PretrainedLm`, an encoder-decoder
    :class:`PretrainedSeq2Seq`).

    Attributes:
      model: the built model (a ``praxis_lite.models.base.BaseModel``).
      params: its weights, sharded over ``mesh``.
      generation: the defaults of ``generate`` (a Hugging Face model's
        generation_config.json, or the experiment's decoder settings).
      mesh, rules: where the weights live and the logical-axis rules used.
      tokenizer: the model's tokenizer (``hf_tokenizer.HfTokenizer``), or None.
      origin: a Hugging Face model's family and config (a Hugging Face directory's, or
        the kept ``hf_model/`` of a paxlite job fine-tuned from one); None otherwise.
      chat_template: its chat template (``hf_chat.ChatTemplate``), or None.
    """

    model: Any
    params: Any
    generation: sampling.DecoderParams
    mesh: Any
    rules: Any
    tokenizer: Any = None
    origin: HfOrigin | None = None
    chat_template: Any = None
    # Jitted programs by what they compute (not copied by dataclasses.replace).
    _programs: dict[Hashable, Any] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def save_pretrained(
        self,
        directory: epath.PathLike,
        max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES,
    ) -> list[str]:
        """Writes a Hugging Face model directory transformers loads to the same logits:
        config.json, model.safetensors (or shards over ``max_shard_bytes`` and an
        index), generation_config.json and the tokenizer's files. Returns the files.

        Raises:
          PretrainedError: the model did not come from a Hugging Face directory.
        """
        if self.origin is None:
            raise PretrainedError(
                "save_pretrained writes Hugging Face families "
                f"({', '.join(sorted(hf_models.FAMILIES))}); this model was loaded from a "
                "paxml checkpoint or a paxlite job not started from a Hugging Face directory."
            )
        directory = epath.Path(directory)
        flat = traverse_util.flatten_dict(self.params, sep="/")
        if lora.adapter_paths(flat):
            raise PretrainedError(
                "this model carries LoRA adapters beside its weights; load it with "
                "merge=True to save the merged model (paxlite-export --adapter writes a "
                "trained run's adapters for PEFT)."
            )
        host = {path: np.asarray(jax.device_get(value)) for path, value in flat.items()}
        files = hf_checkpoint.save(
            directory, host, self.origin.family, self.origin.config, max_shard_bytes=max_shard_bytes
        )
        generation = {**self.origin.generation_config, **_generation_fields(self.generation)}
        path = directory / hf_checkpoint.GENERATION_CONFIG_FILE
        path.write_text(json.dumps(generation, indent=2) + "\n")
        files.append(hf_checkpoint.GENERATION_CONFIG_FILE)
        if self.tokenizer is not None:
            files += [epath.Path(p).name for p in self.tokenizer.save(directory)]
        return files

    @abc.abstractmethod
    def logits(self, input_ids: Any) -> np.ndarray:
        """The model's output scores for token ids (float32 numpy)."""

    def generate(
        self,
        inputs: Any = None,
        max_new_tokens: int | None = None,
        *,
        messages: Any = None,
        return_scores: bool = False,
        **settings: Any,
    ) -> Any:
        """New tokens of each prompt (the model's ``decode``), with Hugging Face's names and
        defaults: a decoder-only model's continuation, an encoder-decoder's targets after
        the decoder start.

        Args:
          inputs: token ids ``[B, T]``, or a list of prompts of any lengths (lists of
            ids, right-padded with 0); or a string or list of strings, encoded with the
            model's tokenizer (its special tokens added, as transformers does).
          max_new_tokens: ``N``; default the generation config's.
          messages: instead of ``inputs``, a conversation (``[{"role", "content"}, ...]``)
            or a list of them, formatted by the model's chat template with the assistant's
            header after it (``add_generation_prompt``); returns the reply (or replies).
            Decoder-only models only.
          return_scores: also return each sequence's score (its summed log-probability;
            with beams, the beam rules' score).
          **settings: ``praxis_lite.decoding.sampling.DecoderParams``' fields: ``do_sample`` (False:
            greedy, whatever the temperature), ``temperature``, ``top_k``, ``top_p``,
            ``num_beams``, ``length_penalty`` or ``length_norm_alpha``, ``early_stopping``,
            ``num_return_sequences``, ``min_new_tokens``, ``repetition_penalty``,
            ``no_repeat_ngram_size``, ``stop_strings`` (needs the tokenizer),
            ``eos_token_id`` (an int or a list), ``pad_token_id``, ``seed``; defaults:
            :attr:`generation`.

        Returns:
          ``[B, N]`` new token ids (``pad_token_id`` after a row's end), ``[B, n, N]`` with
          ``num_return_sequences = n > 1`` (best first); for strings, the decoded new text
          of each (special tokens dropped; a list of ``n`` per row), a string for a string.
          With ``return_scores``, ``(that, scores)``: ``[B]`` or ``[B, n]`` float32.
        """
        if messages is not None:
            return self._chat(messages, max_new_tokens, settings)
        texts = [inputs] if isinstance(inputs, str) else inputs
        as_text = isinstance(texts, list) and bool(texts) and isinstance(texts[0], str)
        if as_text:
            ids, lengths = _right_padded([self._encoded(text) for text in texts])
        else:
            ids, lengths = _prompt_ids(inputs)
        out, params = self._decoded(ids, lengths, max_new_tokens, settings)
        result = out["tokens"]
        if as_text:
            result = self._texts(out["tokens"], out["lengths"], params)
            result = result[0] if isinstance(inputs, str) else result
        return (result, out["scores"].astype(np.float32)) if return_scores else result

    def _decoded(
        self, ids: np.ndarray, lengths: np.ndarray, max_new_tokens: int | None, settings: dict
    ) -> tuple[dict[str, np.ndarray], sampling.DecoderParams]:
        """The model's ``decode`` outputs (numpy, the first ``B`` rows) of prompts ``ids [B,
        P]`` of ``lengths [B]``, and the settings used."""
        params = _settings(self.generation, settings)
        steps = max_new_tokens or params.max_new_tokens
        if steps is None:
            raise ValueError("generate: pass max_new_tokens (the generation config has none).")
        stop = self._stop_table(params)
        make = lambda: _decode_fn(self.model, params, steps, stop)
        key = jax.random.key(params.seed)
        out = self._run(("decode", params, steps), make, ids, lengths, key=key)
        return {name: np.asarray(x)[: len(ids)] for name, x in out.items()}, params

    def _texts(self, tokens: np.ndarray, lengths: np.ndarray, params: Any) -> list:
        """The decoded new text of each sequence of ``tokens [B, (n,) N]`` (its first
        ``lengths`` tokens, before an EOS): ``B`` strings, or ``B`` lists of ``n``."""
        flat = tokens.reshape(-1, tokens.shape[-1])
        counts = lengths.reshape(-1)
        texts = [
            self.tokenizer.decode(_until_eos(row[:count], params))
            for row, count in zip(flat, counts, strict=True)
        ]
        if tokens.ndim == 2:
            return texts
        n = tokens.shape[1]
        return [texts[i : i + n] for i in range(0, len(texts), n)]

    def _stop_table(self, params: sampling.DecoderParams) -> Any:
        """``params.stop_strings`` as ``stop_strings.StopStrings`` of the tokenizer (built
        once per strings), or None without stop strings."""
        if not params.stop_strings:
            return None
        if self.tokenizer is None:
            raise ValueError(
                "generate: stop_strings need the model's tokenizer and this model has none; "
                "pass eos_token_id instead."
            )
        key = ("stop", params.stop_strings)
        if key not in self._programs:
            self._programs[key] = stop_strings.StopStrings.build(
                params.stop_strings, stop_strings.token_bytes(self.tokenizer)
            )
        return self._programs[key]

    @abc.abstractmethod
    def _chat(self, messages: Any, max_new_tokens: int | None, settings: dict) -> Any:
        """``generate(messages=...)``: the replies, or a ValueError saying why not."""

    def _run(
        self, program: Hashable, make: Callable[[], Callable], *rows: np.ndarray, key: Any = None
    ) -> Any:
        """``make()``'s function of ``(params, *rows[, key])``, jitted once per ``program``,
        on ``rows`` (arrays ``[B, ...]``) padded to the mesh's batch split (:meth:`_padded`;
        callers keep the first B rows of the results)."""
        fn = self._programs.get(program)
        if fn is None:
            fn = self._programs[program] = jax.jit(make())
        args = [jnp.asarray(r) for r in self._padded(rows)] + ([] if key is None else [key])
        with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
            return fn(self.params, *args)

    def _encoded(self, text: str) -> list[int]:
        """``text``'s token ids, with the special tokens the tokenizer adds."""
        if self.tokenizer is None:
            raise ValueError("generate: this model has no tokenizer; pass token ids [B, T].")
        return self.tokenizer.encode(text)

    def _padded(self, rows: Any) -> Any:
        """``rows`` (arrays ``[B, ...]``) with zero rows appended so that the batch splits
        over the mesh's batch axes (``partitioning.pad_rows``); callers keep the first B."""
        return partitioning.pad_rows(rows, partitioning.batch_sharding(self.mesh, self.rules))


@dataclasses.dataclass
class PretrainedLm(Pretrained):
    """A decoder-only language model: ``logits`` and ``generate`` (also of chats)."""

    def logits(self, input_ids: Any) -> np.ndarray:
        """``input_ids [B, T]`` int -> next-token logits ``[B, T, V]`` float32 (any ``B``)."""
        ids = _token_ids(input_ids)
        out = self._run("logits", lambda: _method_fn(self.model, "logits", _lm_batch), ids)
        return np.asarray(out, np.float32)[: len(ids)]

    def _chat(self, messages: Any, max_new_tokens: int | None, settings: dict) -> Any:
        """``generate(messages=...)``: each conversation rendered and encoded as transformers'
        ``apply_chat_template(..., add_generation_prompt=True)``; the replies decoded."""
        if self.chat_template is None or self.tokenizer is None:
            raise ValueError("generate(messages=...): this model has no chat template.")
        one = bool(messages) and isinstance(messages[0], dict)
        conversations = [messages] if one else list(messages)
        prompts = [
            self.tokenizer.encode(
                self.chat_template.render(c, add_generation_prompt=True), add_special_tokens=False
            )
            for c in conversations
        ]
        ids, lengths = _right_padded(prompts)
        out, params = self._decoded(ids, lengths, max_new_tokens, settings)
        replies = self._texts(out["tokens"], out["lengths"], params)
        return replies[0] if one else replies


@dataclasses.dataclass
class PretrainedSeq2Seq(Pretrained):
    """An encoder-decoder: targets from inputs (Hugging Face's ``...ForConditionalGeneration``
    calls): ``logits`` (teacher-forced), ``encode`` and ``generate``.

    Inputs are right-padded with id 0 (padding, never attended); the decoder starts from
    id 0 (``EncoderDecoderModel.decode_prompt``'s start, Hugging Face's
    ``decoder_start_token_id``).
    """

    def logits(self, input_ids: Any, decoder_input_ids: Any = None) -> np.ndarray:
        """Teacher-forced next-target logits ``[B, T, V]`` float32 (any ``B``).

        Args:
          input_ids: ``[B, S]`` ints, or a list of rows of any lengths (right-padded with 0).
          decoder_input_ids: ``[B, T]`` ints, each row starting with the decoder start id 0
            (the targets shifted right, Hugging Face's convention); required.
        """
        if decoder_input_ids is None:
            raise ValueError(
                "logits: pass decoder_input_ids [B, T] (the targets shifted right, each row "
                "starting with the decoder start id 0), e.g. [[0]]."
            )
        inputs, _ = _prompt_ids(input_ids)
        targets = _token_ids(decoder_input_ids, "decoder_input_ids")
        if len(targets) != len(inputs):
            raise ValueError(
                f"logits: {len(inputs)} rows of input_ids but {len(targets)} of "
                "decoder_input_ids; pass one decoder row per input."
            )
        out = self._run(
            "logits", lambda: _method_fn(self.model, "logits", _seq2seq_batch), inputs, targets
        )
        return np.asarray(out, np.float32)[: len(inputs)]

    def encode(self, input_ids: Any) -> np.ndarray:
        """The encoder's outputs ``[B, S, D]`` float32 of ``input_ids`` (``[B, S]`` ints, or a
        list of rows right-padded with 0)."""
        inputs, _ = _prompt_ids(input_ids)
        out = self._run("encode", lambda: _method_fn(self.model, "encode"), inputs)
        return np.asarray(out, np.float32)[: len(inputs)]

    def _chat(self, messages: Any, max_new_tokens: int | None, settings: dict) -> Any:
        raise ValueError(
            "generate(messages=...) is for decoder-only models; pass this encoder-decoder "
            "its inputs (token ids or strings)."
        )


def pretrained_class(model: Any) -> type[Pretrained]:
    """What ``from_pretrained`` wraps ``model`` in: the model's ``is_encoder_decoder``."""
    return PretrainedSeq2Seq if model.is_encoder_decoder else PretrainedLm


def _prompt_ids(inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Token ids ``[B, T]`` (all of length T) or a list of rows of any lengths (right-padded
    with 0) as ids ``[B, T]`` int32 and lengths ``[B]``."""
    if isinstance(inputs, list) and inputs and isinstance(inputs[0], list):
        return _right_padded(inputs)
    ids = _token_ids(inputs)
    return ids, np.full((len(ids),), ids.shape[1], np.int32)


def _right_padded(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of any lengths as ids ``[B, T]`` (right-padded with 0) and lengths ``[B]``."""
    if not all(rows):
        raise ValueError("every row of token ids (prompt or input) needs at least one token.")
    ids = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
    return ids, np.array([len(r) for r in rows], np.int32)


def _settings(defaults: sampling.DecoderParams, settings: dict[str, Any]) -> Any:
    """``defaults`` with generate's ``settings`` (an old Pax name or an unknown one is one
    error line naming the fields); ``pad_token_id=None`` is the first EOS id, as
    transformers pads."""
    known = [f.name for f in dataclasses.fields(sampling.DecoderParams)]
    unknown = sorted(set(settings) - set(known))
    try:
        params = dataclasses.replace(defaults, **settings)
    except TypeError as e:
        if "is now" in str(e):
            raise
        raise TypeError(
            f"generate: unknown setting {', '.join(unknown)}; it takes {', '.join(known)}."
        ) from None
    if params.pad_token_id is None:
        eos = params.eos_token_id
        first = eos[0] if isinstance(eos, (tuple, list)) else eos
        params = dataclasses.replace(params, pad_token_id=0 if first is None else int(first))
    return params


def _until_eos(row: np.ndarray, params: sampling.DecoderParams) -> list[int]:
    """``row``'s tokens before its first EOS."""
    eos = params.eos_token_id
    stops = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    out = []
    for token in row.tolist():
        if token in stops:
            break
        out.append(token)
    return out


def _generation_fields(params: sampling.DecoderParams) -> dict[str, Any]:
    """generation_config.json's fields of ``params`` (transformers' names)."""
    fields = {
        "do_sample": params.do_sample,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "pad_token_id": params.pad_token_id,
    }
    if params.top_k:
        fields["top_k"] = params.top_k
    if params.eos_token_id is not None:
        eos = params.eos_token_id
        fields["eos_token_id"] = eos if isinstance(eos, int) else list(eos)
    if params.max_new_tokens is not None:
        fields["max_new_tokens"] = params.max_new_tokens
    return fields


def _token_ids(input_ids: Any, name: str = "input_ids") -> np.ndarray:
    """``input_ids`` as ``[B, T]`` int32, or a ValueError naming the shape it needs."""
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or 0 in ids.shape or ids.dtype.kind not in "iu":
        raise ValueError(
            f"{name} must be token ids [B, T] with B, T >= 1, got shape {ids.shape} of "
            f"{ids.dtype}; pass one row per prompt, e.g. [[3, 5, 7]]."
        )
    return ids.astype(np.int32)


def _method_fn(model: Any, method: str, batch: Callable[..., Any] | None = None) -> Callable:
    """``(params, *arrays) -> model.<method>(batch(*arrays))`` (to jit); without ``batch``,
    the method takes the one array as is."""

    def apply(params, *arrays):
        arg = arrays[0] if batch is None else batch(*arrays)
        return model.apply({"params": params}, arg, method=method)

    return apply


def _decode_fn(
    model: Any, params: sampling.DecoderParams, steps: int, stop: Any = None
) -> Callable:
    """``(weights, ids, lengths, key) ->`` the model's ``decode`` of ``steps`` new tokens
    (``stop``: the stop strings' tables, constants of the program)."""

    def decode(weights, ids, lengths, key):
        return model.decode({"params": weights}, ids, lengths, key, params, steps, stop)

    return decode


def _lm_batch(ids: jax.Array) -> NestedMap:
    """A decoder-only model's ``logits`` batch: ``ids [B, T]``, no padding."""
    return NestedMap(ids=ids, paddings=jnp.zeros(ids.shape, jnp.float32))


def _seq2seq_batch(input_ids: jax.Array, decoder_ids: jax.Array) -> NestedMap:
    """An encoder-decoder's ``logits`` batch (seqio's ``EncDecFeatureConverter`` keys)."""
    return NestedMap(encoder_input_tokens=input_ids, decoder_input_tokens=decoder_ids)
