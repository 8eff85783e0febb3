"""praxis 1.4.0's mixture of experts, as fixtures: GShard's top-2 gating on fixed logits, and
two tiny MoE LMs trained by paxml's own main.py (their checkpoints and logits).

Runs in the paxml venv (make_venv.sh), from the repository root:

    JAX_PLATFORMS=cpu /tmp/paxml-venv/bin/python tools/pax_fixtures/make_moe.py tests/fixtures/pax

(``--aux-only`` after the directory: only recompute the aux losses of the checkpoints there;
``--gating-only``: only moe_gating.npz.)

Writes ``<out>/moe_gating.npz``: for each case ``<case>_<field>``: ``logits [G, S, E]``,
``paddings [G, S]``, ``capacity_factor``, ``logit_cap`` (the capped case), and praxis'
``combine [G, S, E, C]``, ``dispatch``, ``aux_loss``, ``over_capacity [2]`` and
``dispatched [3]`` (the fractions of tokens sent to 0, 1 and 2 experts, as praxis'
summaries); and, per experiment of tiny_experiments.py's MoE
ones, what make_checkpoints.py writes plus ``aux_loss`` (praxis' summed
``aux_moe_load_balance_loss`` of the logits batch) in its logits.npz.
"""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from paxml import experiment_registry
from praxis import base_layer, gshard_utils, pax_fiddle

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from tools.pax_fixtures import make_checkpoints  # noqa: E402

EXPERIMENTS = ("TinyLmCloudSpmdMoe", "TinyC4SpmdAdamMoe")


def gating_cases() -> dict[str, dict]:
    """Fixed logits: plenty of capacity; overflow with paddings; a tiny capacity factor
    (capacity from the given minimum); logits with ties broken by order."""
    rng = np.random.default_rng(0)
    cases = {}
    logits = rng.normal(size=(2, 8, 4)).astype(np.float32) * 2.0
    cases["roomy"] = dict(logits=logits, paddings=np.zeros((2, 8), np.float32), capacity_factor=4.0)
    skewed = rng.normal(size=(3, 12, 4)).astype(np.float32)
    skewed[..., 0] += 2.0  # Most tokens want expert 0 first: first choices overflow too.
    paddings = np.zeros((3, 12), np.float32)
    paddings[0, -3:] = 1.0
    paddings[2, :2] = 1.0
    cases["overflow"] = dict(logits=skewed, paddings=paddings, capacity_factor=1.0)
    wide = rng.normal(size=(2, 16, 8)).astype(np.float32) * 3.0
    cases["small_factor"] = dict(
        logits=wide, paddings=np.zeros((2, 16), np.float32), capacity_factor=0.5
    )
    large = rng.normal(size=(2, 8, 4)).astype(np.float32) * 20.0  # Capped: 5 tanh(x / 5)
    cases["capped"] = dict(
        logits=large, paddings=np.zeros((2, 8), np.float32), capacity_factor=2.0, logit_cap=5.0
    )
    return cases


def gating(out: pathlib.Path) -> None:
    arrays = {}
    for name, case in gating_cases().items():
        aux, combine, dispatch, summary = gshard_utils.top2_gating_on_logits(
            paddings=jnp.asarray(case["paddings"]),
            logits=jnp.asarray(case["logits"]),
            experts_dim=case["logits"].shape[-1],
            expert_capacity_dim=0,
            fprop_dtype=jnp.float32,
            second_expert_policy="all",
            legacy_mtf_behavior=True,
            capacity_factor=case["capacity_factor"],
            mask_dtype=jnp.int32,
            gating_logit_cap=case.get("logit_cap", 0.0),
        )
        over_1, over_2, d0, d1, d2 = summary
        counts = np.array([d0, d1, d2], np.float32)
        for key, value in dict(
            case,
            combine=combine,
            dispatch=dispatch,
            aux_loss=aux,
            over_capacity=np.array([over_1, over_2], np.float32),
            dispatched=counts / counts.sum(),
        ).items():
            arrays[f"{name}_{key}"] = np.asarray(value)
        print(name, "capacity", combine.shape[-1], "aux", float(aux), flush=True)
    np.savez(out / "moe_gating.npz", **arrays)


def aux_loss(name: str, params: dict, ids: np.ndarray) -> float:
    """praxis' summed aux losses of the logits batch (as its LanguageModel adds them)."""
    model = pax_fiddle.instantiate(experiment_registry.get(name)().task().model)
    batch = make_checkpoints.lm_batch(ids)
    context = base_layer.JaxContext.HParams(do_eval=True)
    with base_layer.JaxContext.new_context(hparams=context):
        _, variables = model.apply(
            {"params": params},
            batch,
            method=model.compute_predictions,
            mutable=[base_layer.AUX_LOSS],
        )
    # Each term is praxis' AuxLossStruct(value, weight): the values are what it adds.
    terms = jax.tree_util.tree_leaves(
        variables[base_layer.AUX_LOSS], is_leaf=lambda x: hasattr(x, "weight")
    )
    return float(sum(np.sum(np.asarray(term.value)) for term in terms))


def main(out_dir: str, train: bool = True, gating_only: bool = False) -> None:
    """All fixtures; ``train=False`` (``--aux-only``): only the aux losses, from the
    checkpoints already there; ``gating_only`` (``--gating-only``): only moe_gating.npz."""
    out = pathlib.Path(out_dir)
    if train or gating_only:
        gating(out)
    if gating_only:
        return
    for name in EXPERIMENTS:
        if train:
            make_checkpoints.make(name, out)
        fixture = dict(np.load(out / name / "logits.npz"))
        step_dir = (
            out / name / "checkpoints" / f"checkpoint_{make_checkpoints.tiny_experiments.STEPS:08d}"
        )
        fixture["aux_loss"] = np.float32(
            aux_loss(name, make_checkpoints.read_params(step_dir), fixture["ids"])
        )
        np.savez(out / name / "logits.npz", **fixture)
        print(name, "aux_loss", fixture["aux_loss"], flush=True)


if __name__ == "__main__":
    jax.config.update("jax_platforms", "cpu")
    flags = sys.argv[2:]
    main(sys.argv[1], train="--aux-only" not in flags, gating_only="--gating-only" in flags)
