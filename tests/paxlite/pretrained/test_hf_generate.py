"""Beam search and the logits controls of ``from_pretrained(...).generate`` against
transformers' own ``generate`` on the llama3 (decoder-only) and t5_flan fixtures
(``generate_cases.json``, made by tools/hf_fixtures/make_generate_fixtures.py): 4 beams
with length penalties 1, 0 and 2, early stopping, two EOS ids, n-best lists, and
repetition penalty, no-repeat n-grams and min_new_tokens with greedy decoding and beams;
hypotheses that end in EOS and ones that reach max_new_tokens.
"""

import collections
import json

import numpy as np
import pytest

from paxlite.pretrained.loading import from_pretrained
from tests import FIXTURES

_HF = FIXTURES / "hf"
NEW_TOKENS = 6  # max_new_tokens of every recorded case
# (case, prompt) pairs run here (each compiles once): every setting, both kinds of ending,
# the early stop after 3 steps (llama3 beam3_two_eos, prompt 1) and both EOS ids of a list.
RUN = {
    "llama3": [
        ("beam4", 0),
        ("beam4_lp0", 1),
        ("beam4_lp2", 0),
        ("beam4_early", 0),
        ("beam3_two_eos", 1),
        ("greedy_controls", 1),
        ("beam4_controls", 0),
    ],
    "t5_flan": [("beam4", 1), ("beam3_two_eos", 0), ("beam4_controls", 1)],
}


@pytest.fixture(scope="module", params=["llama3", "t5_flan"])
def recorded(request):
    """(name, the fixture loaded here, its cases grouped by name: [(prompt, case)...])."""
    cases = json.loads((_HF / request.param / "generate_cases.json").read_text())["cases"]
    by_name = collections.defaultdict(list)
    for case in cases:
        by_name[case["name"]].append(case)
    return request.param, from_pretrained(_HF / request.param), by_name


def _settings(case: dict) -> dict:
    kwargs = dict(case["kwargs"])
    assert kwargs.pop("decoder_start_token_id", 0) == 0  # Our seq2seq decoders start at 0.
    return kwargs


def _check_run(model, case: dict, where: str) -> tuple[int, int]:
    """Generates as ``case`` did; asserts transformers' hypotheses (and scores). Returns
    (hypotheses ending in an EOS, hypotheses reaching max_new_tokens)."""
    settings = _settings(case)
    tokens, scores = model.generate([case["prompt"]], NEW_TOKENS, return_scores=True, **settings)
    n = settings.get("num_return_sequences", 1)
    tokens = np.asarray(tokens).reshape(n, NEW_TOKENS)
    eos = settings["eos_token_id"]
    eos = set(eos) if isinstance(eos, list) else {eos}
    ended = reached = 0
    for j, (want, length) in enumerate(zip(case["sequences"], case["lengths"], strict=True)):
        assert tokens[j, :length].tolist() == want[:length], f"{where} hypothesis {j}"
        ended += want[length - 1] in eos
        reached += length == NEW_TOKENS and want[length - 1] not in eos
    if "scores" in case:
        got = np.asarray(scores).reshape(n)
        np.testing.assert_allclose(got, case["scores"], rtol=2e-5, err_msg=where)
    return ended, reached


@pytest.mark.slow
def test_beams_and_controls_are_transformers(recorded):
    name, model, by_name = recorded
    ended_in_eos = reached_max = 0
    for case_name, row in RUN[name]:  # Each prompt has its own EOS: one compile per run.
        ended, reached = _check_run(model, by_name[case_name][row], f"{name} {case_name} {row}")
        ended_in_eos, reached_max = ended_in_eos + ended, reached_max + reached
    assert ended_in_eos and reached_max


@pytest.fixture(scope="module")
def llama3():
    return from_pretrained(_HF / "llama3")


@pytest.mark.slow
def test_stop_strings_strings_out_and_the_n_best(llama3):
    """A stop string taken from the middle of a greedy reply ends the row at the token that
    completes it; strings in give strings out, n per row with their scores."""
    prompt = "The cat sat"
    tokens = llama3.generate([llama3.tokenizer.encode(prompt)], 8, eos_token_id=None)[0]
    texts = [llama3.tokenizer.decode(tokens[:i].tolist()) for i in range(1, 9)]
    cut = next(i for i in range(2, 8) if len(texts[i]) > len(texts[i - 1]) + 1)
    stop = texts[cut][len(texts[cut - 1]) - 1 :]  # spans the last two tokens' text
    stopped = llama3.generate(prompt, 8, eos_token_id=None, stop_strings=[stop])
    assert stopped == texts[cut] and stopped.endswith(stop)
    replies, scores = llama3.generate(
        [prompt, "Hello"], 4, num_beams=3, num_return_sequences=2, return_scores=True
    )
    assert [len(r) for r in replies] == [2, 2] and all(isinstance(t, str) for t in replies[0])
    assert scores.shape == (2, 2) and (scores[:, 0] >= scores[:, 1]).all()
    with pytest.raises(ValueError, match="more than num_beams"):
        llama3.generate(prompt, 4, num_beams=2, num_return_sequences=3)
