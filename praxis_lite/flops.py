"""Model FLOPs of a train step: the definitions and the Transformer count behind them.

A model states its training FLOPs through the model contract
(``praxis_lite.models.base.BaseModel.train_flops``); the trainer turns them into MFU
without knowing the model. Three labelled definitions (:class:`FlopsDefinition`),
per token of a decoder-only Transformer:

* ``6N``: ``6 * N_blocks`` (Kaplan et al. 2020, "Scaling laws", section 2.1).
  ``N_blocks`` = weights of the matmuls inside the Transformer blocks (q, k, v,
  output projection, feed-forward; biases and norms left out): the
  non-embedding parameters.
* ``palm``: ``6 * N + 12 * L*H*Q*T`` (Chowdhery et al. 2022, PaLM, Appendix B),
  with ``N = N_blocks + D*V``: every weight a token multiplies, so the output
  (logits) projection is in and an input embedding lookup is not (with a shared
  embedding table, ``N`` is the whole table once). ``L`` layers, ``H`` heads,
  ``Q`` dims per head, ``T`` sequence length: the full ``T x T`` attention map in
  the forward and backward passes.
* ``causal``: as ``palm`` with the attention term halved (``6 * L*H*Q*T``): a
  causal model needs only the lower triangle of the attention map. This is the
  default for MFU (MaxText counts the same way); ``palm`` is higher by the
  masked half that dense kernels compute anyway.

Training = forward + backward = 3 x forward; rematerialization (recomputing the
forward in the backward pass) is not model work and is never counted.

A mixture-of-experts layer counts what a token multiplies (:class:`MoeFfn`): its ``k``
experts' matmuls, the router and a shared expert; not the ``E - k`` experts it skips, and
not the dispatch and combine einsums of capacity routing (data movement written as
matmuls: overhead that XLA's count includes and MFU does not).
"""

from __future__ import annotations

import dataclasses
import enum


class FlopsDefinition(enum.Enum):
    """Which model-FLOPs formula an MFU figure uses (see the module docstring)."""

    SIX_N = "6N"
    PALM = "palm"
    CAUSAL = "causal"

    @property
    def formula(self) -> str:
        return {
            FlopsDefinition.SIX_N: "6 * N_blocks * tokens",
            FlopsDefinition.PALM: "(6 * (N_blocks + D*V) + 12 * L*H*Q*T) * tokens",
            FlopsDefinition.CAUSAL: "(6 * (N_blocks + D*V) + 6 * L*H*Q*T) * tokens",
        }[self]


DEFAULT_DEFINITION = FlopsDefinition.CAUSAL


@dataclasses.dataclass(frozen=True)
class MoeFfn:
    """The feed-forward of one mixture-of-experts layer, as the FLOPs count sees it.

    Attributes:
      active_params: matmul weights one token multiplies: ``k`` experts, the router
        ``[D, E]`` and any shared expert.
      total_params: every expert's weights, the router and the shared expert.
      note: a few words for reports (``E=8 top-2 capacity``).
    """

    active_params: int
    total_params: int
    note: str


@dataclasses.dataclass(frozen=True)
class StackLayout:
    """How a Transformer stack runs its blocks (what a stack tells the FLOPs count).

    Attributes:
      num_layers: ``L`` blocks in all.
      block: the block's config (a ``Transformer`` config).
      scan_trips: blocks run as one scanned loop body, which XLA's cost analysis
        counts once (1: no scan).
      remat: the backward pass recomputes the forward (a remat policy is on).
      pipelined: the blocks run inside a pipeline's loop (XLA's count of loop
        bodies cannot be corrected).
      moe_block: the config of the blocks ``moe_layers`` counts, when they differ from
        ``block`` (a stack mixing dense and mixture-of-experts layers); None: none.
      moe_layers: how many of the ``num_layers`` blocks are ``moe_block``'s.
    """

    num_layers: int
    block: object
    scan_trips: int = 1
    remat: bool = False
    pipelined: bool = False
    moe_block: object | None = None
    moe_layers: int = 0


@dataclasses.dataclass(frozen=True)
class LmShape:
    """What the FLOPs of a decoder-only Transformer LM depend on.

    Attributes:
      num_layers: ``L`` Transformer blocks in all.
      model_dims: ``D``.
      hidden_dims: ``F``, feed-forward hidden dims.
      num_heads: ``H`` query heads.
      num_kv_heads: key/value heads.
      dims_per_head: ``Q``.
      gated: the feed-forward has a gate projection (GLU variants: 3 matrices).
      vocab_size: ``V``.
      causal: the attention is causal.
      moe: the feed-forward of the mixture-of-experts layers; None: none.
      moe_layers: how many of the ``L`` layers have ``moe`` instead of the dense
        feed-forward of ``hidden_dims``.
    """

    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    num_kv_heads: int
    dims_per_head: int
    gated: bool
    vocab_size: int
    causal: bool = True
    moe: MoeFfn | None = None
    moe_layers: int = 0

    @classmethod
    def of_stack(
        cls,
        layout: StackLayout,
        block: dict,
        moe_block: dict | None,
        model_dims: int,
        vocab_size: int,
    ) -> LmShape:
        """The shape of a stack of ``layout``: ``block`` / ``moe_block`` are its blocks'
        ``matmul_shape()`` (``moe``: their MoeFfn, None for a dense block)."""
        moe, moe_layers = block["moe"], layout.num_layers
        if moe is None and moe_block is not None:
            moe, moe_layers = moe_block["moe"], layout.moe_layers
        sizes = {k: v for k, v in block.items() if k != "moe"}
        return cls(
            num_layers=layout.num_layers,
            model_dims=model_dims,
            vocab_size=vocab_size,
            moe=moe,
            moe_layers=moe_layers if moe is not None else 0,
            **sizes,
        )

    @property
    def attention_params(self) -> int:
        """Matmul weights of one block's attention: q, k, v and post projections."""
        d, q = self.model_dims, self.dims_per_head
        return d * q * (2 * self.num_heads + 2 * self.num_kv_heads)

    @property
    def block_params(self) -> int:
        """Matmul weights of one dense block: q, k, v, post projections and the feed-forward."""
        return self.attention_params + (3 if self.gated else 2) * self.model_dims * self.hidden_dims

    @property
    def non_embedding_params(self) -> int:
        """``N_blocks``: ``L * block_params``, with each MoE layer's active feed-forward in
        place of the dense one."""
        dense = self.num_layers * self.block_params
        if self.moe is None:
            return dense
        dense_ffn = self.block_params - self.attention_params
        return dense + self.moe_layers * (self.moe.active_params - dense_ffn)

    @property
    def matmul_params(self) -> int:
        """``N_blocks + D*V``: every weight a token is multiplied by (logits included)."""
        return self.non_embedding_params + self.model_dims * self.vocab_size

    def flops_per_token(self, seq_len: int, definition: FlopsDefinition) -> float:
        """Train-step FLOPs per token (forward + backward) under ``definition``."""
        attention = self.num_layers * self.num_heads * self.dims_per_head * seq_len
        if definition is FlopsDefinition.SIX_N:
            return 6.0 * self.non_embedding_params
        if definition is FlopsDefinition.PALM:
            return 6.0 * self.matmul_params + 12.0 * attention
        return 6.0 * self.matmul_params + 6.0 * attention

    def flops_per_step(
        self, global_batch: int, seq_len: int, definition: FlopsDefinition = DEFAULT_DEFINITION
    ) -> float:
        """Train-step FLOPs of ``global_batch x seq_len`` tokens (all devices together)."""
        return self.flops_per_token(seq_len, definition) * global_batch * seq_len

    def all_definitions(self, global_batch: int, seq_len: int) -> dict[str, float]:
        """``{definition value: FLOPs per step}`` for every definition."""
        return {d.value: self.flops_per_step(global_batch, seq_len, d) for d in FlopsDefinition}

    def block_flops_per_token(self, seq_len: int) -> float:
        """``palm`` FLOPs of one block per token, the mean over the blocks (MoE layers count
        their active feed-forward)."""
        mean_params = self.non_embedding_params / self.num_layers
        return 6.0 * mean_params + 12.0 * self.num_heads * self.dims_per_head * seq_len

    def describe(self) -> str:
        """``L=2 D=64 F=256 heads=4x16 V=64`` style one-liner."""
        kv = f" kv {self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        moe = ""
        if self.moe is not None:
            moe = (
                f" MoE {self.moe_layers}/{self.num_layers} layers {self.moe.note} "
                "(active weights counted; dispatch/combine are overhead)"
            )
        return (
            f"L={self.num_layers} D={self.model_dims} F={self.hidden_dims}"
            f"{' gated' if self.gated else ''} heads={self.num_heads}x{self.dims_per_head}{kv} "
            f"V={self.vocab_size}{moe}"
        )


@dataclasses.dataclass(frozen=True)
class EncoderDecoderShape:
    """What the FLOPs of an encoder-decoder Transformer depend on.

    Attributes:
      encoder: the encoder's blocks (``vocab_size`` 0: the logits are the decoder's;
        ``causal`` False).
      decoder: the decoder's blocks and the vocabulary; each block also has a
        cross-attention with the decoder's heads: q and the output projection per target
        token, k and v per input token, a full ``T x S`` attention map.
    """

    encoder: LmShape
    decoder: LmShape

    @property
    def cross_params(self) -> tuple[int, int]:
        """One cross-attention's matmul weights ``(q + output, k + v)``."""
        dec = self.decoder
        per_head = dec.model_dims * dec.dims_per_head
        return 2 * per_head * dec.num_heads, 2 * per_head * dec.num_kv_heads

    @property
    def non_embedding_params(self) -> int:
        """Every block's matmul weights, cross-attentions included."""
        cross = sum(self.cross_params) * self.decoder.num_layers
        return self.encoder.non_embedding_params + self.decoder.non_embedding_params + cross

    def six_n_flops(self, s: int, t: int) -> float:
        """``6N`` of one example: each weight times the tokens it multiplies (the
        encoder's and the cross k/v's: ``S`` inputs; the decoder's: ``T`` targets)."""
        enc, dec = self.encoder, self.decoder
        q_out, k_v = self.cross_params
        per_input = enc.non_embedding_params + dec.num_layers * k_v
        per_target = dec.non_embedding_params + dec.num_layers * q_out
        return 6.0 * (per_input * s + per_target * t)

    def flops_per_example(self, s: int, t: int, definition: FlopsDefinition) -> float:
        """Train-step FLOPs of one example of ``s`` inputs and ``t`` targets.

        ``palm`` adds the logits (``6 D V T``) and every attention map in full (``12 H Q``
        per query-key pair: the encoder's ``S^2``, the decoder's ``T^2``, the cross
        ``T S``); ``causal`` halves the decoder's self-attention only.
        """
        six_n = self.six_n_flops(s, t)
        if definition is FlopsDefinition.SIX_N:
            return six_n
        enc, dec = self.encoder, self.decoder
        enc_map = enc.num_layers * enc.num_heads * enc.dims_per_head * s * s
        dec_map = dec.num_layers * dec.num_heads * dec.dims_per_head * t * t
        cross_map = dec.num_layers * dec.num_heads * dec.dims_per_head * t * s
        self_share = 6.0 if definition is FlopsDefinition.CAUSAL else 12.0
        logits = 6.0 * dec.model_dims * dec.vocab_size * t
        return six_n + logits + 12.0 * (enc_map + cross_map) + self_share * dec_map

    def block_flops_per_example(self, s: int, t: int) -> tuple[float, float]:
        """``palm`` FLOPs of one encoder block and of one decoder block, per example."""
        enc, dec = self.encoder, self.decoder
        q_out, k_v = self.cross_params
        encoder = enc.block_flops_per_token(s) * s
        heads = dec.num_heads * dec.dims_per_head
        cross = 6.0 * (q_out * t + k_v * s) + 12.0 * heads * t * s
        return encoder, dec.block_flops_per_token(t) * t + cross

    def describe(self) -> str:
        """``enc L=2 ... | dec L=2 ... V=64`` style one-liner."""
        enc = self.encoder.describe().rsplit(" V=", 1)[0]
        return f"enc {enc} | dec {self.decoder.describe()}"


@dataclasses.dataclass(frozen=True)
class TrainFlops:
    """A model's training FLOPs (forward + backward) for one example of a batch.

    Attributes:
      per_example: ``{FlopsDefinition value: FLOPs}`` for one example.
      tokens_per_example: tokens one example counts (``T`` for sequence models).
      description: the counted shape in one line (for reports).
      non_embedding_params: ``N_blocks`` where the model has it, else None.
      scan_trips: layers run as one scanned loop body that XLA counts once.
      scan_body_per_example: FLOPs XLA's count misses per extra scan trip, for
        one example (with the recomputed forward when ``remat``).
      xla_note: why XLA's count of this model cannot be corrected (loop bodies
        it counts once); None when it can.
    """

    per_example: dict[str, float]
    tokens_per_example: int
    description: str
    non_embedding_params: int | None = None
    scan_trips: int = 1
    scan_body_per_example: float = 0.0
    xla_note: str | None = None

    @classmethod
    def of_encoder_decoder(
        cls,
        shape: EncoderDecoderShape,
        lengths: tuple[int, int],
        layouts: tuple[StackLayout, StackLayout],
    ) -> TrainFlops:
        """The count of an encoder-decoder of ``shape`` on examples of ``lengths = (S, T)``
        input and target tokens; ``layouts``: the encoder's and the decoder's stacks.

        Tokens per example: the targets ``T`` (what the loss counts: T5X's target tokens).
        Both stacks scanned: XLA counts one trip of each, and the missed trips of both are
        stated as ``scan_trips - 1`` bodies of their mean (``scan_body_per_example``).
        """
        s, t = lengths
        bodies = shape.block_flops_per_example(s, t)
        missed = sum(
            (layout.scan_trips - 1) * body * (4 / 3 if layout.remat else 1)
            for layout, body in zip(layouts, bodies, strict=True)
        )
        scanned = sum(layout.scan_trips - 1 for layout in layouts)  # Trips XLA missed.
        return cls(
            per_example={d.value: shape.flops_per_example(s, t, d) for d in FlopsDefinition},
            tokens_per_example=t,
            description=f"{shape.describe()} S={s} T={t}",
            non_embedding_params=shape.non_embedding_params,
            scan_trips=scanned + 1,
            scan_body_per_example=missed / scanned if scanned else 0.0,
            xla_note=(
                "loop bodies (pipeline iterations, scanned layers) counted once; not corrected"
                if any(layout.pipelined for layout in layouts)
                else None
            ),
        )

    @classmethod
    def of_lm(cls, shape: LmShape, seq_len: int, layout: StackLayout) -> TrainFlops:
        """The count of a Transformer LM of ``shape`` on examples of ``seq_len`` tokens."""
        blocks_a_trip = layout.num_layers / layout.scan_trips  # A scanned group of layers.
        body = shape.block_flops_per_token(seq_len) * seq_len * blocks_a_trip
        body *= 4 / 3 if layout.remat else 1
        return cls(
            per_example={d.value: shape.flops_per_step(1, seq_len, d) for d in FlopsDefinition},
            tokens_per_example=seq_len,
            description=shape.describe(),
            non_embedding_params=shape.non_embedding_params,
            scan_trips=layout.scan_trips,
            scan_body_per_example=body,
            xla_note=(
                "loop bodies (pipeline iterations, scanned layers) counted once; not corrected"
                if layout.pipelined
                else None
            ),
        )

    def per_step(self, global_batch: int) -> dict[str, float]:
        """``{definition value: FLOPs}`` of a step of ``global_batch`` examples."""
        return {name: flops * global_batch for name, flops in self.per_example.items()}
