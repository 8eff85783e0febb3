"""Builds LoRA adapters with the real ``peft`` library on two base fixtures of make_fixtures.py
(Llama 3 and GPT-2) and stores each, with its logits, as a test fixture that paxlite's JAX loader
reads without torch; checks paxlite's exported adapters and merged models with ``peft``.

Runs in the venv of make_venv.sh, by hand (never by CI), from the repository root, after
make_fixtures.py (the base fixtures are read, never written):

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_peft_fixtures.py tests/fixtures/hf

Writes, per adapter (``ADAPTERS``), ``<out>/<name>/``:

- what ``PeftModel.save_pretrained`` writes: ``adapter_config.json`` (``base_model_name_or_path``
  a hub-style id, ``paxlite-fixtures/<base>``; ``target_modules`` sorted) and
  ``adapter_model.safetensors``, lora_A and lora_B both seeded random (PEFT starts lora_B at
  zero, which would hide a swapped or dropped factor); not its README.md model card;
- ``outputs.npz``: the base fixture's ``ids [2, T]`` int32, ``prompt_0``/``prompt_1``, and the
  PeftModel's (eval, no grad) ``logits [2, T, V]`` float32 and ``greedy_0``/``greedy_1``.

Each fixture is checked after it is written: reloaded with ``PeftModel.from_pretrained`` and,
merged with ``merge_and_unload`` and saved, with ``AutoModelForCausalLM`` (the two modes below).

Checks what paxlite exports (within 1e-4 of the logit scale, as make_fixtures' --check; greedy
decodes too where NPZ has ``prompt_i``/``greedy_i``); exits 1 on a mismatch:

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_peft_fixtures.py \
        --check-adapter BASE_DIR ADAPTER_DIR NPZ
    /tmp/hf-venv/bin/python tools/hf_fixtures/make_peft_fixtures.py --check-model MODEL_DIR NPZ

``--check-adapter`` passes the base model to ``PeftModel.from_pretrained`` itself, so the
adapter's ``base_model_name_or_path`` may be anything.
"""

import argparse
import dataclasses
import os
import pathlib
import shutil
import sys
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import peft  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from make_fixtures import (  # noqa: E402
    MIN_GREEDY_GAP,
    check_greedy,
    check_logits,
    greedy,
    greedy_without_cache,
    logits_of,
)
from transformers import AutoModelForCausalLM  # noqa: E402

HUB_ORG = "paxlite-fixtures"  # adapter_config.json's base_model_name_or_path: HUB_ORG/<base>.
LORA_STD = 0.05  # lora_A and lora_B entries: LORA_STD * N(0, 1).
MIN_CHANGE = 0.05  # the adapter must move the logits by this, relative to their scale.
# LoraConfig's arguments common to every adapter.
LORA_COMMON = dict(r=4, lora_alpha=8, lora_dropout=0.0, task_type="CAUSAL_LM")


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A LoRA adapter fixture.

    Attributes:
      name: its directory under the fixture root.
      base: the base fixture's directory (a family of make_fixtures.py).
      lora: LoraConfig's arguments besides LORA_COMMON.
      seed: seeds lora_A and lora_B; chosen so that no greedy step is a near tie (top-2 gap >=
        MIN_GREEDY_GAP) and both greedy decodes differ from the base fixture's.
    """

    name: str
    base: str
    lora: dict
    seed: int


ADAPTERS = (
    Adapter("llama3_lora", "llama3", dict(target_modules=["q_proj", "v_proj"]), seed=9),
    # GPT-2's Conv1D stores [in, out]: fan_in_fan_out. "c_proj" is attn.c_proj and mlp.c_proj.
    # rsLoRA scales by lora_alpha / sqrt(r) = 4 instead of lora_alpha / r = 2.
    Adapter(
        "gpt2_lora",
        "gpt2",
        dict(target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True, use_rslora=True),
        seed=3,
    ),
)


def load_model(model_dir: str | pathlib.Path) -> transformers.PreTrainedModel:
    """``model_dir`` as ``AutoModelForCausalLM``: float32, eager attention, eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), attn_implementation="eager", dtype=torch.float32
    )
    return model.eval()


def randomize_lora(model: peft.PeftModel, seed: int) -> None:
    """Sets every lora_A and lora_B weight to LORA_STD * N(0, 1), in parameter name order."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(LORA_STD * torch.randn(param.shape, generator=generator))


def assert_lora_layout(model: peft.PeftModel, config: peft.LoraConfig) -> None:
    """Asserts that every LoRA module computes ``base(x) + s (x A^T) B^T`` with lora_A [r, in],
    lora_B [out, r] (GPT-2's Conv1D too) and s = lora_alpha / r, or / sqrt(r) with rsLoRA."""
    scale = config.lora_alpha / (config.r**0.5 if config.use_rslora else config.r)
    generator = torch.Generator().manual_seed(0)
    modules = [m for m in model.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    assert modules, "no LoRA module"
    with torch.no_grad():
        for module in modules:
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            assert a.shape == (config.r, module.in_features), (a.shape, module.in_features)
            assert b.shape == (module.out_features, config.r), (b.shape, module.out_features)
            assert module.scaling["default"] == scale, (module.scaling, scale)
            x = torch.randn(3, module.in_features, generator=generator)
            expected = module.base_layer(x) + scale * (x @ a.T) @ b.T
            torch.testing.assert_close(module(x), expected)


def make_peft_model(adapter: Adapter, base_dir: pathlib.Path) -> peft.PeftModel:
    """The base fixture with ``adapter``'s LoRA modules, randomized, in eval mode."""
    config = peft.LoraConfig(**LORA_COMMON, **adapter.lora)
    model = peft.get_peft_model(load_model(base_dir), config)
    randomize_lora(model, adapter.seed)
    assert_lora_layout(model, config)
    return model.eval()


def save_adapter(model: peft.PeftModel, adapter: Adapter, out: pathlib.Path) -> None:
    """Writes adapter_config.json (hub-style base id, sorted target_modules: PEFT writes its set
    in hash order) and adapter_model.safetensors to ``out``, world-readable."""
    config = model.peft_config["default"]
    config.base_model_name_or_path = f"{HUB_ORG}/{adapter.base}"
    config.target_modules = sorted(config.target_modules)
    model.save_pretrained(str(out), save_embedding_layers=False)  # no hub lookup of the base
    (out / "README.md").unlink()  # PEFT's model card template (with this machine's path).
    for path in out.iterdir():
        path.chmod(0o644)


def greedy_arrays(model: peft.PeftModel, base: dict) -> tuple[dict, float]:
    """greedy_i [<= NEW_TOKENS] from the base fixture's prompt_i, and the smallest top-2 gap.

    Asserts that generate (with its KV cache) equals greedy decoding by full forward passes.
    """
    eos = model.generation_config.eos_token_id
    eos = list(eos) if isinstance(eos, list) else [eos]
    arrays, gaps = {}, []
    for i in range(2):
        prompt = base[f"prompt_{i}"]
        new = greedy(model, prompt)
        reference, gap = greedy_without_cache(model, prompt, eos)
        assert np.array_equal(new, reference), (i, new, reference)
        assert gap >= MIN_GREEDY_GAP, f"greedy_{i}: top-2 gap {gap}: change the seed"
        arrays[f"prompt_{i}"], arrays[f"greedy_{i}"] = prompt, new
        gaps.append(gap)
    return arrays, min(gaps)


def self_check(
    adapter: Adapter, model: peft.PeftModel, base_dir: pathlib.Path, out: pathlib.Path
) -> None:
    """Runs both check modes on the written fixture: the adapter as saved, and merged."""
    npz = out / "outputs.npz"
    assert check_adapter(base_dir, out, npz), f"{adapter.name}: --check-adapter failed"
    with tempfile.TemporaryDirectory() as merged:
        model.merge_and_unload().save_pretrained(merged)
        assert check_model(merged, npz), f"{adapter.name}: --check-model (merged) failed"


def write_adapter(adapter: Adapter, out_root: pathlib.Path) -> None:
    """Builds, writes and checks fixture ``out_root / adapter.name``; prints its summary."""
    base_dir, out = out_root / adapter.base, out_root / adapter.name
    base = dict(np.load(base_dir / "outputs.npz"))
    shutil.rmtree(out, ignore_errors=True)
    model = make_peft_model(adapter, base_dir)
    save_adapter(model, adapter, out)
    logits = logits_of(model, base["ids"])
    arrays, gap = greedy_arrays(model, base)
    np.savez(out / "outputs.npz", ids=base["ids"], logits=logits, **arrays)
    scale = float(np.abs(logits).max())
    change = float(np.abs(logits - base["logits"]).max())
    assert change >= MIN_CHANGE * scale, f"{adapter.name}: the adapter changes the logits little"
    for i in range(2):
        same = np.array_equal(arrays[f"greedy_{i}"], base[f"greedy_{i}"])
        assert not same, f"{adapter.name}: greedy_{i} as the base's: change the seed"
    self_check(adapter, model, base_dir, out)
    summary = {
        "KB": round(sum(f.stat().st_size for f in out.iterdir()) / 1024),
        "max |logit|": round(scale, 3),
        "max |logits - base|": round(change, 3),
        "relative": round(change / scale, 3),
        "min greedy top-2 gap": round(gap, 3),
    }
    print(adapter.name, ", ".join(f"{key}: {value}" for key, value in summary.items()), flush=True)


# --- --check-adapter, --check-model ---------------------------------------------------------


def check_outputs(model: torch.nn.Module, npz: str | pathlib.Path) -> bool:
    """Compares ``model``'s logits (and greedy decodes, where NPZ has them) with NPZ's; prints
    the figures and PASS or FAIL."""
    fixture = dict(np.load(npz))
    results = [check_logits(model, fixture)]
    if {"prompt_0", "greedy_0", "prompt_1", "greedy_1"} <= fixture.keys():
        results.append(check_greedy(model, fixture))
    ok = all(results)
    print("PASS" if ok else "FAIL", flush=True)
    return ok


def check_adapter(
    base_dir: str | pathlib.Path, adapter_dir: str | pathlib.Path, npz: str | pathlib.Path
) -> bool:
    """``PeftModel.from_pretrained(base_dir's model, adapter_dir)`` against NPZ."""
    model = peft.PeftModel.from_pretrained(load_model(base_dir), str(adapter_dir))
    print(f"--check-adapter {adapter_dir} on {base_dir}:")
    return check_outputs(model.eval(), npz)


def check_model(model_dir: str | pathlib.Path, npz: str | pathlib.Path) -> bool:
    """``AutoModelForCausalLM.from_pretrained(model_dir)`` (e.g. a merged export) against NPZ."""
    print(f"--check-model {model_dir}:")
    return check_outputs(load_model(model_dir), npz)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", help="the fixture root (tests/fixtures/hf)")
    parser.add_argument(
        "--check-adapter",
        nargs=3,
        metavar=("BASE_DIR", "ADAPTER_DIR", "NPZ"),
        help="a PEFT adapter on BASE_DIR vs NPZ's logits",
    )
    parser.add_argument(
        "--check-model", nargs=2, metavar=("MODEL_DIR", "NPZ"), help="MODEL_DIR vs NPZ's logits"
    )
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    if args.check_adapter:
        sys.exit(0 if check_adapter(*args.check_adapter) else 1)
    if args.check_model:
        sys.exit(0 if check_model(*args.check_model) else 1)
    if not args.out_dir:
        parser.error("give OUT_DIR, --check-adapter or --check-model")
    for adapter in ADAPTERS:
        write_adapter(adapter, pathlib.Path(args.out_dir))


if __name__ == "__main__":
    main()
