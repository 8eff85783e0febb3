"""Records what Hugging Face ``transformers``' own ``generate()`` returns (beam search, and greedy
search with a few logits processors) on existing fixtures (llama3, t5_flan, and the mixtures of
experts mixtral, qwen2_moe, qwen3_moe), so that paxlite's JAX beam search can be tested against
it in CI without torch.

Runs in the venv of make_venv.sh, by hand (never by CI), from the repository root, after
make_fixtures.py and make_t5_fixtures.py (it reads their directories and changes no file in them):

    /tmp/hf-venv/bin/python tools/hf_fixtures/make_generate_fixtures.py tests/fixtures/hf
    /tmp/hf-venv/bin/python tools/hf_fixtures/make_generate_fixtures.py tests/fixtures/hf \
        --only mixtral,qwen2_moe

Loads ``<dir>/t5_flan`` with ``T5ForConditionalGeneration`` and the others (``EOS``'s keys) with
``AutoModelForCausalLM`` (float32, eval, MoE experts eager; no sampling anywhere, so no seed) and
writes ``generate_cases.json`` into each directory:

    {"transformers": "5.24.0", "torch": "2.15.0+cu132", "cases": [
      {"name": str,            # beam4, beam4_lp0, beam4_lp2, beam4_early, beam3_two_eos,
                               # greedy_controls, beam4_controls
       "prompt": [int],        # decoder-only: outputs.npz's prompt_i; t5_flan: row i of input_ids
                               # without its padding (it ends with </s> 1)
       "kwargs": {...},        # exactly the keyword arguments given to generate() besides the
                               # input ids and an all-ones attention_mask
       "sequences": [[int]],   # each returned sequence's new tokens, best first: without the
                               # prompt (decoder-only) or the decoder start token 0 (t5_flan); all
                               # rows as wide as generate returned them (the longest one)
       "lengths": [int],       # each one's real length: its generated tokens, an EOS that
                               # ended it included; what follows it is filler
       "scores": [float]}]}    # beam cases only: sequences_scores, in the order of sequences

One batch row a call (no padding). Each case runs on both prompts of each fixture (14 cases a
file), with ``max_new_tokens`` 6, ``do_sample`` False and ``pad_token_id`` given. The EOS ids
(``EOS`` below) are chosen per prompt (by hand; for the mixtures of experts by trying such
tokens in turn until the checks below pass) from tokens that beam search without an EOS
produces in its lower beams, so that the results hold hypotheses that end with EOS before the
length limit and hypotheses that reach it; greedy_controls' EOS is the second token of the greedy
decode under the case's other processors, so without ``min_new_tokens`` it would stop there.

The script asserts: the fixture's generation_config sets nothing but token ids and flags (no
sampling, no processor); each returned hypothesis either ends with its first EOS or has 6 tokens;
the scores are sorted; each beam score equals the sum of its hypothesis' processed log-probs
(``compute_transition_scores``) / length ** length_penalty; among each fixture's cases, some
hypothesis ends with EOS before 6 tokens and some reaches 6 tokens without one;
``min_new_tokens`` changes greedy_controls' output; and no decision was a near tie, each gap at
least ``MIN_GAP``: at every beam step, the K-th vs (K + 1)-th candidate (K = num_beams x
max(2, 1 + number of EOS ids), the candidates kept), the num_beams-th vs the next (only the first
num_beams may finish), the num_beams-th vs the next candidate that did not stop (the running
beams), the num_beams-th vs the next finished hypothesis where one joins, the early-stop
comparison (best running score / current length ** length_penalty vs the worst finished score);
consecutive final scores; each greedy step's top 2. For a mixture of experts, every token of
every row that generate runs (all beams, the prompt included) is routed with a margin of at least
make_fixtures.MIN_ROUTER_MARGIN (k-th minus (k+1)-th router probability). It prints each case
and whether the penalties of the *_controls cases change their output. Deterministic (one CPU
thread): two runs (different ``PYTHONHASHSEED``) give byte-identical files.

What transformers 5.24 does here (generation/utils.py ``_beam_search``), which a test must match:
a hypothesis' score is (sum of its processed log-probs) / L ** length_penalty with L its new
tokens, its EOS included (T5: the start token not counted); in beam search the processors
(repetition penalty, n-gram ban) act on log_softmax(logits), in greedy search on the logits; they
see the prompt (llama3) or the decoder ids with the start token 0 (t5_flan), not the encoder
input. After a hypothesis' end, generate fills with ``pad_token_id or eos_token_id[0]``: a pad id
of 0 is false, so t5_flan's rows are filled with the (first) EOS, llama3's with pad 319. With
``early_stopping`` False the search stops once every one of the num_beams places holds a finished
hypothesis and the best running beam's score / its current length ** length_penalty is no
better than the worst of them: llama3's prompt 1 beam3_two_eos stops after 3 steps, and misses a
6-token hypothesis that ``early_stopping="never"`` would return.

Versions: Python 3.11, torch 2.15.0 (``torch.__version__`` "2.15.0+cu132"), transformers 5.24.0
(the venv of make_venv.sh).
"""

import argparse
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from make_fixtures import MIN_ROUTER_MARGIN, router_margins  # noqa: E402
from transformers import AutoModelForCausalLM, T5ForConditionalGeneration  # noqa: E402

MAX_NEW_TOKENS = 6
MIN_GAP = 5e-4  # every compared pair of scores (see the docstring) is at least this far apart.
MAX_BYTES = 50_000  # each generate_cases.json.

# Per fixture and prompt: the EOS id of the beam cases, the second EOS id of beam3_two_eos, and
# greedy_controls' EOS. Chosen by hand from beam search and greedy runs without an EOS (see the
# docstring); the assertions say whether they still do their job.
EOS = {
    "llama3": [
        {"eos": 7, "eos2": 86, "greedy_eos": 153},
        {"eos": 51, "eos2": 153, "greedy_eos": 17},
    ],
    "t5_flan": [
        {"eos": 242, "eos2": 55, "greedy_eos": 72},
        {"eos": 55, "eos2": 145, "greedy_eos": 90},
    ],
    "mixtral": [
        {"eos": 316, "eos2": 123, "greedy_eos": 278},
        {"eos": 249, "eos2": 243, "greedy_eos": 131},
    ],
    "qwen2_moe": [
        {"eos": 53, "eos2": 315, "greedy_eos": 79},
        {"eos": 228, "eos2": 110, "greedy_eos": 49},
    ],
    "qwen3_moe": [
        {"eos": 306, "eos2": 112, "greedy_eos": 306},
        {"eos": 207, "eos2": 287, "greedy_eos": 257},
    ],
}

GENERATION_CONFIG_KEYS = {  # what the fixtures' generation_config.json may set.
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "decoder_start_token_id",
    "output_attentions",
    "output_hidden_states",
    "use_cache",
    "transformers_version",
    "_from_model_config",
}


def case_kwargs(name: str, eos: dict) -> dict:
    """The generate keyword arguments of case NAME (without the token ids every case sets)."""
    beam = {"do_sample": False, "length_penalty": 1.0, "early_stopping": False}
    cases = {
        "beam4": {**beam, "num_beams": 4, "num_return_sequences": 4},
        "beam4_lp0": {**beam, "num_beams": 4, "num_return_sequences": 4, "length_penalty": 0.0},
        "beam4_lp2": {**beam, "num_beams": 4, "num_return_sequences": 2, "length_penalty": 2.0},
        "beam4_early": {**beam, "num_beams": 4, "num_return_sequences": 4, "early_stopping": True},
        "beam3_two_eos": {**beam, "num_beams": 3, "num_return_sequences": 3},
        "greedy_controls": {
            "do_sample": False,
            "num_beams": 1,
            "repetition_penalty": 1.5,
            "no_repeat_ngram_size": 2,
            "min_new_tokens": 3,
        },
        "beam4_controls": {
            **beam,
            "num_beams": 4,
            "num_return_sequences": 4,
            "repetition_penalty": 1.3,
            "no_repeat_ngram_size": 2,
        },
    }
    kwargs = cases[name]
    if name == "beam3_two_eos":
        kwargs["eos_token_id"] = [eos["eos"], eos["eos2"]]
    elif name == "greedy_controls":
        kwargs["eos_token_id"] = eos["greedy_eos"]
    else:
        kwargs["eos_token_id"] = eos["eos"]
    return kwargs


CASES = [
    "beam4",
    "beam4_lp0",
    "beam4_lp2",
    "beam4_early",
    "beam3_two_eos",
    "greedy_controls",
    "beam4_controls",
]


class GapRecorder:
    """Wraps three of generate's beam search steps on MODEL (instance attributes shadowing its
    methods) and records, at each of their cuts, how far the scores on either side are apart: a
    near tie there could flip the result in another implementation. Orders that decide nothing
    (within the kept candidates, within the running beams) are not checked."""

    def __init__(self, model: transformers.PreTrainedModel):
        self.gaps: list[tuple[str, float]] = []
        self.finished = torch.zeros(0)
        topk, update, early = (
            model._get_top_k_continuations,
            model._update_finished_beams,
            model._check_early_stop_heuristic,
        )

        def top_k_continuations(**kw):
            # The K = beams_to_keep candidates kept, and the first num_beams of them (only those
            # may finish).
            k, beams = kw["beams_to_keep"], kw["num_beams"]
            values = torch.topk(kw["accumulated_log_probs"][0], k=k + 1).values
            self.cut("kept candidates", values, k)
            self.cut("top num_beams candidates", values, beams)
            return topk(**kw)

        def update_finished_beams(**kw):
            beams = kw["num_beams"]
            scores, hits = kw["topk_log_probs"][0], kw["next_token_hits_stopping_criteria"][0]
            # The running beams: the best num_beams candidates that did not stop.
            self.cut("running beams", scores[~hits], beams)
            # The finished hypotheses: the best num_beams of the old ones and those that join.
            length = kw["cur_len"] + 1 - kw["decoder_prompt_len"]
            new = scores / length ** kw["length_penalty"]
            joins = hits & kw["top_num_beam_mask"] & kw["is_early_stop_heuristic_unsatisfied"][0]
            if kw["early_stopping"] is True and bool(kw["is_sent_finished"].all()):
                joins &= False
            if joins.any():
                self.cut("finished", torch.cat((kw["beam_scores"][0], new[joins])), beams)
            out = update(**kw)
            self.finished = out[1][0]  # the finished hypotheses' scores, sorted.
            return out

        def check_early_stop_heuristic(**kw):
            finished = kw["is_sent_finished"]
            if bool(finished.all()) and bool(kw["is_early_stop_heuristic_unsatisfied"].all()):
                # The same arithmetic as generate's: the best running score vs the worst finished.
                length = kw["cur_len"] - kw["decoder_prompt_len"]
                if kw["early_stopping"] == "never" and kw["length_penalty"] > 0.0:
                    length = kw["max_length"] - kw["decoder_prompt_len"]
                best = kw["running_beam_scores"][0, 0] / length ** kw["length_penalty"]
                self.gaps.append(("early stop", abs(float(best - kw["beam_scores"][0].min()))))
            return early(**kw)

        model._get_top_k_continuations = top_k_continuations
        model._update_finished_beams = update_finished_beams
        model._check_early_stop_heuristic = check_early_stop_heuristic

    def cut(self, what: str, values: torch.Tensor, n: int) -> None:
        """Records the gap between the n-th and (n + 1)-th best of VALUES, if both are real."""
        values = values[values > -1e8]  # -inf (banned) and generate's -1e9 markers out.
        if values.numel() > n:
            values = torch.sort(values, descending=True).values
            self.gaps.append((what, float(values[n - 1] - values[n])))

    def pop(self) -> list[tuple[str, float]]:
        gaps, self.gaps = self.gaps, []
        return gaps


def load(directory: pathlib.Path, name: str) -> tuple[transformers.PreTrainedModel, list, dict]:
    """The model of fixture NAME, its two prompts and the token ids every case passes."""
    fixture = np.load(directory / "outputs.npz")
    if name == "t5_flan":
        model = T5ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32)
        mask = fixture["attention_mask"]
        prompts = [fixture["input_ids"][i][mask[i] == 1] for i in range(2)]
        ids = {"pad_token_id": model.config.pad_token_id}
        ids["decoder_start_token_id"] = model.config.decoder_start_token_id
        assert ids == {"pad_token_id": 0, "decoder_start_token_id": 0}, ids
    else:
        # Experts eager (MoE fixtures), as make_fixtures.py computes them; dense models ignore it.
        model = AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, experts_implementation="eager"
        )
        prompts = [fixture["prompt_0"], fixture["prompt_1"]]
        ids = {"pad_token_id": model.generation_config.pad_token_id}
    model.eval()
    config = model.generation_config
    print(f"{name}: generation_config {json.dumps(config.to_diff_dict(), sort_keys=True)}")
    extra = set(config.to_diff_dict()) - GENERATION_CONFIG_KEYS
    assert not extra, f"{name}'s generation_config sets {extra}"
    # transformers 5 leaves what a file does not set None (generate fills in its defaults).
    assert config.do_sample in (None, False) and config.num_beams in (None, 1), config
    return model, [[int(t) for t in p] for p in prompts], ids


def run_case(model, prompt: list, kwargs: dict, recorder: GapRecorder) -> dict:
    """Runs generate with KWARGS on PROMPT alone; returns the case's record (and checks it)."""
    encoder_decoder = model.config.is_encoder_decoder
    ids = torch.tensor([prompt])
    beam = kwargs["num_beams"] > 1
    with torch.no_grad(), router_margins(model) as margins:
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW_TOKENS,
            return_dict_in_generate=True,
            output_scores=True,
            **kwargs,
        )
    start = 1 if encoder_decoder else len(prompt)
    prefix = [model.config.decoder_start_token_id] if encoder_decoder else prompt
    sequences = out.sequences.tolist()
    assert all(row[:start] == prefix for row in sequences), sequences
    new = [row[start:] for row in sequences]
    eos = kwargs["eos_token_id"]
    eos = set(eos) if isinstance(eos, list) else {eos}
    if beam:
        # beam_indices: one entry a generated token (EOS included), -1 after.
        lengths = [int((row != -1).sum()) for row in out.beam_indices]
        assert all(
            row[:n].count(-1) == 0
            for row, n in zip(out.beam_indices.tolist(), lengths, strict=True)
        )
    else:
        lengths = [len(row) for row in new]  # batch of 1: generate stops at the EOS.
    for row, n in zip(new, lengths, strict=True):
        assert row[n - 1] in eos or n == MAX_NEW_TOKENS, (row, n)
        assert all(t not in eos for t in row[: n - 1]), (row, n)
    record = {"sequences": new, "lengths": lengths}
    gaps = recorder.pop()
    if beam:
        scores = out.sequences_scores.tolist()
        assert scores == sorted(scores, reverse=True), scores
        transition = model.compute_transition_scores(
            out.sequences, out.scores, out.beam_indices, normalize_logits=False
        )
        for row, n, score in zip(transition, lengths, scores, strict=True):
            expected = float(row.sum()) / n ** kwargs["length_penalty"]
            assert abs(expected - score) < 1e-5 * max(1.0, abs(score)), (expected, score)
        record["scores"] = scores
        # the order of the final hypotheses (and which num_return_sequences of them return).
        final = recorder.finished[recorder.finished > -1e8].tolist()
        assert final[: len(scores)] == scores, (final, scores)
        gaps += [("final order", a - b) for a, b in zip(final, final[1:], strict=False)]
    else:
        for step in out.scores:
            top2 = torch.topk(step[0], k=2).values
            gaps.append(("greedy", float(top2[0] - top2[1])))
    fillers = {t for row, n in zip(new, lengths, strict=True) for t in row[n:]}
    record["_filler"] = sorted(fillers)
    record["_gaps"] = gaps
    record["_steps"] = len(out.scores)
    record["_margin"] = min(margins, default=None)
    return record


def make_fixture(directory: pathlib.Path, name: str) -> dict:
    """Writes DIRECTORY/generate_cases.json; returns its content."""
    model, prompts, ids = load(directory, name)
    recorder = GapRecorder(model)
    cases = []
    for i, prompt in enumerate(prompts):
        for case in CASES:
            kwargs = {**case_kwargs(case, EOS[name][i]), **ids}
            record = run_case(model, prompt, kwargs, recorder)
            gaps = record.pop("_gaps")
            filler = record.pop("_filler")
            steps = record.pop("_steps")
            margin = record.pop("_margin")
            smallest = min(gaps, key=lambda g: g[1])
            ends = [
                "eos" if row[n - 1] in np.atleast_1d(kwargs["eos_token_id"]) else "max"
                for row, n in zip(record["sequences"], record["lengths"], strict=True)
            ]
            print(
                f"  prompt {i} {case:16s} eos {kwargs['eos_token_id']}: "
                + "; ".join(
                    f"{row[:n]} {end}" + (f" {s:.4f}" if "scores" in record else "")
                    for row, n, end, s in zip(
                        record["sequences"],
                        record["lengths"],
                        ends,
                        record.get("scores", [0.0] * len(ends)),
                        strict=True,
                    )
                )
                + f" | {steps} steps, filler {filler} | min gap {smallest[1]:.4f} ({smallest[0]})"
                + ("" if margin is None else f" | min router margin {margin:.4f}")
            )
            assert smallest[1] >= MIN_GAP, (case, i, smallest)
            assert margin is None or margin >= MIN_ROUTER_MARGIN, (case, i, margin)
            if case == "greedy_controls":
                without = {k: v for k, v in kwargs.items() if k != "min_new_tokens"}
                other = run_case(model, prompt, without, recorder)
                recorder.pop()
                print(f"    without min_new_tokens: {other['sequences'][0]}")
                assert other["sequences"] != record["sequences"], "min_new_tokens changes nothing"
            if case.endswith("_controls"):  # printed, not asserted.
                plain = {
                    k: v
                    for k, v in kwargs.items()
                    if k not in ("repetition_penalty", "no_repeat_ngram_size")
                }
                other = run_case(model, prompt, plain, recorder)
                recorder.pop()
                print(f"    without the penalties: {other['sequences']}")
            cases.append({"name": case, "prompt": prompt, "kwargs": kwargs, **record})
    ends_eos = ends_max = False
    for case in cases:
        eos = np.atleast_1d(case["kwargs"]["eos_token_id"])
        for row, n in zip(case["sequences"], case["lengths"], strict=True):
            ends_eos |= bool(row[n - 1] in eos and n < MAX_NEW_TOKENS)
            ends_max |= bool(row[n - 1] not in eos and n == MAX_NEW_TOKENS)
    assert ends_eos and ends_max, f"{name}: EOS endings {ends_eos}, max-length endings {ends_max}"
    content = {"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}
    text = json.dumps(content, indent=1)
    # Each innermost list of numbers on one line.
    text = re.sub(
        r"\[([-0-9.e,\s]+)\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]",
        text,
    )
    assert json.loads(text) == content
    path = directory / "generate_cases.json"
    path.write_text(text + "\n")
    size = path.stat().st_size
    print(f"{path}: {size} bytes")
    assert size < MAX_BYTES, size
    return content


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", help="the fixture root (tests/fixtures/hf)")
    parser.add_argument("--only", metavar="NAME[,NAME]", help="write only these fixtures' cases")
    args = parser.parse_args()
    wanted = list(EOS) if args.only is None else [name.strip() for name in args.only.split(",")]
    unknown = sorted(set(wanted) - set(EOS))
    if unknown:
        parser.error(f"--only: unknown fixtures {unknown}; known: {list(EOS)}")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(1)
    for name in EOS:
        if name in wanted:
            make_fixture(pathlib.Path(args.fixtures) / name, name)


if __name__ == "__main__":
    sys.exit(main())
