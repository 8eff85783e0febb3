"""Chat templates against transformers' own renderings and ids (tests/fixtures/hf/<family>/
chat_cases.json, written by tools/hf_fixtures); the assistant weights of encode_chat; errors."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from praxis_lite.tokenizers.hf_chat import (
    ChatBoundaryError,
    ChatTemplate,
    ChatTemplateError,
    encode_chat,
)
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer
from tests import FIXTURES as TEST_FIXTURES
from tests import REPO

FIXTURES = TEST_FIXTURES / "hf"
# family -> (the header that starts an assistant turn, its end-of-turn token).
TURNS = {
    "qwen2": ("<|im_start|>assistant\n", "<|im_end|>"),
    "llama3": ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>"),
}
CHAT = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "river"},
]


def _cases(family: str) -> list[dict]:
    return json.loads((FIXTURES / family / "chat_cases.json").read_text())["cases"]


def _runs(ids: list[int], weights: list[int]) -> list[tuple[int, list[int]]]:
    """Maximal runs of equal weight: [(weight, ids)]."""
    runs: list[tuple[int, list[int]]] = []
    for i, w in zip(ids, weights, strict=True):
        if runs and runs[-1][0] == w:
            runs[-1][1].append(i)
        else:
            runs.append((w, [i]))
    return runs


def _tokenizer_dir(tmp_path: pathlib.Path, family: str = "qwen2", **config) -> pathlib.Path:
    """A copy of a fixture's tokenizer (no chat_template.jinja), tokenizer_config.json + config."""
    directory = tmp_path / family
    directory.mkdir()
    shutil.copyfile(FIXTURES / family / "tokenizer.json", directory / "tokenizer.json")
    base = json.loads((FIXTURES / family / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return directory


@pytest.mark.parametrize("family", sorted(TURNS))
def test_renders_as_transformers(family):
    template = ChatTemplate.from_dir(FIXTURES / family)
    assert template.source == str(FIXTURES / family / "chat_template.jinja")
    for case in _cases(family):
        assert template.render(case["messages"]) == case["rendered"]
        assert template.render(case["messages"], True) == case["rendered_with_prompt"]


@pytest.mark.parametrize("family", sorted(TURNS))
def test_ids_are_transformers_and_weights_cover_the_assistant_turns(family):
    """Weighted runs: each assistant content + end-of-turn token, in order; the rest (system
    and user turns, the role headers, ChatML's newline after <|im_end|>) weighs 0."""
    tokenizer = HfTokenizer.from_dir(FIXTURES / family)
    template = ChatTemplate.from_dir(FIXTURES / family)
    header, end = TURNS[family]
    for case in _cases(family):
        messages = case["messages"]
        ids, weights = encode_chat(tokenizer, template, messages)
        assert ids == case["ids"]
        assert set(weights) <= {0, 1} and len(weights) == len(ids)
        runs = [
            (w, tokenizer.decode(run, skip_special_tokens=False)) for w, run in _runs(ids, weights)
        ]
        assert "".join(text for _, text in runs) == case["rendered"]  # Runs split at characters.
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [text for w, text in runs if w] == [a + end for a in answers]
        for (w, before), (next_w, _) in zip(runs, runs[1:], strict=False):
            if next_w:  # The role header before an assistant turn weighs 0.
                assert not w and before.endswith(header)
        unweighted = "".join(text for w, text in runs if not w)
        for message in messages:
            if message["role"] != "assistant":
                assert message["content"] in unweighted
        assert unweighted.count(header) == len(answers)


def test_template_in_tokenizer_config_json(tmp_path):
    """Older directories: chat_template in tokenizer_config.json, a string or named templates
    ('default' is used); chat_template.jinja wins over it, as in transformers."""
    text = (FIXTURES / "qwen2" / "chat_template.jinja").read_text()
    want = _cases("qwen2")[0]
    as_string = _tokenizer_dir(tmp_path, chat_template=text)
    template = ChatTemplate.from_dir(as_string)
    assert template.source.endswith("tokenizer_config.json: chat_template")
    assert template.render(want["messages"], True) == want["rendered_with_prompt"]
    named = [{"name": "tool_use", "template": "tools"}, {"name": "default", "template": text}]
    (tmp_path / "b").mkdir()
    as_list = _tokenizer_dir(tmp_path / "b", chat_template=named)
    assert ChatTemplate.from_dir(as_list).render(want["messages"]) == want["rendered"]
    (as_list / "chat_template.jinja").write_text("{{ messages | length }}")
    assert ChatTemplate.from_dir(as_list).render(want["messages"]) == str(len(want["messages"]))


def test_filters_globals_and_generation_markers_as_transformers():
    """tojson without HTML escaping (a None value dropped from the message), loop controls,
    {% generation %} blocks rendering their body, the special token variables."""
    template = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}",
        special_tokens={"bos_token": "<s>"},
    )
    message = {"role": "user", "content": "<b>&'café'</b>", "name": None}
    skipped = {"role": "skip", "content": "x"}
    assert (
        template.render([message, skipped]) == '<s>{"role": "user", "content": "<b>&\'café\'</b>"}'
    )


def test_no_template_is_none_and_encode_chat_says_so():
    assert ChatTemplate.from_dir(FIXTURES / "gpt2") is None
    tokenizer = HfTokenizer.from_dir(FIXTURES / "gpt2")
    with pytest.raises(ChatTemplateError, match="gpt2 has no chat template") as e:
        encode_chat(tokenizer, None, CHAT)
    assert "\n" not in str(e.value)


def test_a_token_straddling_a_turn_boundary_raises_naming_the_turn():
    """'assistant: ' + 'river': byte-level BPE makes ' river' one token across the boundary."""
    template = ChatTemplate(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer = HfTokenizer.from_dir(FIXTURES / "qwen2")
    with pytest.raises(ChatBoundaryError, match=r"turn 1 \(assistant\): its start") as e:
        encode_chat(tokenizer, template, CHAT)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "template, messages, message",
    [
        ("{% for m in messages %}{{ m.content }}{% endfor", CHAT,
         r"<string>: the chat template is not valid Jinja \(line 1: "),
        ("{{ raise_exception('Only user and assistant roles') }}", CHAT,
         r"<string>: the chat template raised TemplateError on 2 messages: Only user and"),
        ("{{ messages[0].content.nope.deeper }}", CHAT, r"raised UndefinedError on 2 messages"),
        ("{{ messages }}", [{"content": "hi"}], r"message 0 has no 'role' \(keys: content\)"),
        ("{{ messages }}", [{"role": "user", "content": None}],
         r"message 0 has no 'content' \(keys: role\); each message needs"),
        ("{{ messages }}", "hi", r"messages is a str, not a list"),
        ("{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}{% endfor %}",
         CHAT + [{"role": "user", "content": "more"}],
         r"<string>: turn 1 \(assistant\): messages\[:2\] alone render otherwise"),
        ("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
         "{% if add_generation_prompt %}bot:{% endif %}", CHAT,
         r"turn 1 \(assistant\): messages\[:1\] with add_generation_prompt=True do not render"),
    ],
    ids=["syntax", "raise_exception", "undefined", "no-role", "no-content", "not-a-list",
         "rewrites-turns", "other-prompt"],
)  # fmt: skip
def test_errors_are_one_line(template, messages, message):
    tokenizer = HfTokenizer.from_dir(FIXTURES / "qwen2")
    with pytest.raises(ChatTemplateError, match=message) as e:
        encode_chat(tokenizer, ChatTemplate(template), messages)
    assert "\n" not in str(e.value)


def test_directory_errors_are_one_line_and_name_the_file(tmp_path):
    bad = _tokenizer_dir(tmp_path)
    (bad / "chat_template.jinja").write_text("{% if messages %}\nno end\n")
    with pytest.raises(ChatTemplateError, match=r"chat_template.jinja: the chat template is not "):
        ChatTemplate.from_dir(bad)
    (tmp_path / "b").mkdir()
    named = _tokenizer_dir(tmp_path / "b", chat_template=[{"name": "rag", "template": "x"}])
    with pytest.raises(ChatTemplateError, match=r"names templates \['rag'\] but none 'default'"):
        ChatTemplate.from_dir(named)
    with pytest.raises(ChatTemplateError, match="is not a directory") as e:
        ChatTemplate.from_dir(tmp_path / "missing")
    assert "\n" not in str(e.value)


def test_import_loads_neither_seqio_nor_tensorflow():
    code = (
        "import sys, praxis_lite.tokenizers.hf_chat; "
        "assert not {'seqio', 'tensorflow'} & set(sys.modules), 'loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
