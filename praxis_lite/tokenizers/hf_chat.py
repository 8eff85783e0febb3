"""Chat templates: ``ChatTemplate.from_dir(model_dir)`` renders a Hugging Face model directory's
chat template as transformers 5's ``apply_chat_template`` does, and ``encode_chat`` gives a
conversation's token ids with a loss weight per token that is 1 exactly on the assistant's turns.

Where the template is. transformers 5's ``save_pretrained`` writes it to ``chat_template.jinja``
beside the tokenizer (and leaves it out of tokenizer_config.json); directories saved by older
versions hold it in tokenizer_config.json's ``chat_template``: a string, or a list of
``{"name", "template"}`` of which the one named "default" is used (transformers' choice without
tools). ``chat_template.jinja`` wins where both exist, as in transformers. The other named
templates (``additional_chat_templates/``, the list's others) are not read.

Rendering is transformers': Jinja's ``ImmutableSandboxedEnvironment`` with ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, the globals ``raise_exception(message)`` and
``strftime_now(format)``, a ``tojson`` filter that is ``json.dumps`` (no HTML escaping,
``ensure_ascii=False``, with ``indent``, ``separators``, ``sort_keys``), and
``{% generation %}...{% endgeneration %}`` rendering its body. The template sees ``messages``,
``add_generation_prompt`` and the special token strings that tokenizer_config.json /
special_tokens_map.json name (``bos_token``, ``eos_token``, ``pad_token``, ``mask_token``, any
other ``*_token`` and the named ``extra_special_tokens``; a null one is not passed). A message
is a mapping with a string ``role`` and a ``content``; keys whose value is None are dropped, and
values are rebuilt from plain JSON types (anything else becomes ``"<TypeName>"``), as
transformers does.

Assistant weights (``encode_chat``). The rendered conversation is tokenized with
``add_special_tokens=False`` (the template writes BOS where the model wants it). For the
assistant message ``messages[i]``, its text is the characters ``[a, b)`` of the rendering, with
  a = len(render(messages[:i], add_generation_prompt=True))  (after the role header),
  b = len(render(messages[:i + 1]).rstrip())  (after the end-of-turn token),
so it holds the content and what the template writes after it up to the end-of-turn token
(``<|im_end|>``, ``<|eot_id|>``); whitespace after that token (ChatML's newline) is not the
model's to generate and is left out. Both renderings must begin the whole one (a template that
rewrites earlier turns, or whose generation prompt is not the header it writes, raises).

Characters to tokens. With ``ids = encode(text)`` and ``n(x) = len(encode(text[:x]))``, the
tokens of ``[a, b)`` are ``ids[n(a):n(b)]``, provided ``encode(text[:x]) == ids[:n(x)]`` at
``x = a`` and ``x = b``: the first n(x) tokens of the whole then hold exactly ``text[:x]``. A
token straddles ``x`` when it holds characters from both sides of it (the tokenizer merged
across ``x``, e.g. a header's newline with a content's leading newline); then no prefix of
``ids`` ends at ``x``, that check fails, and ``encode_chat`` raises ``ChatBoundaryError`` naming
the turn rather than weighting the straddling token either way.

Importing this module imports neither seqio nor TensorFlow.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from praxis_lite.tokenizers import hf_tokenizer
from praxis_lite.tokenizers.hf_tokenizer import HfTokenizer

CHAT_TEMPLATE_FILE = "chat_template.jinja"
_ASSISTANT = "assistant"


class ChatTemplateError(ValueError):
    """A chat template is missing, malformed or raises, or a message is malformed (one line)."""


class ChatBoundaryError(ChatTemplateError):
    """The tokenizer merges characters across the start or end of an assistant turn (one line)."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' marker of the assistant's text):
    its body, rendered as transformers renders it (in a caller's scope)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types, as transformers hands messages to a template."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    for kind, plain in ((str, str.__str__), (int, int.__int__), (float, float.__float__)):
        if isinstance(value, kind):  # A subclass (an enum, a numpy float): its base value.
            return plain(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        return _plain(value.item())  # A numpy scalar.
    return f"<{type(value).__name__}>"


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checked messages, None values dropped, as plain data."""
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            f"messages is a {type(messages).__name__}, not a list of {{'role', 'content'}} dicts."
        )
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"message {i} is a {type(message).__name__}, not a {{'role', 'content'}} dict."
            )
        message = {k: v for k, v in message.items() if v is not None}
        for key in ("role", "content"):
            if key not in message:
                raise ChatTemplateError(
                    f"message {i} has no {key!r} (keys: {', '.join(map(str, message)) or 'none'})"
                    "; each message needs a 'role' and a 'content'."
                )
        if not isinstance(message["role"], str):
            raise ChatTemplateError(f"message {i}: role {message['role']!r} is not a string.")
        out.append(_plain(message))
    return out


def _special_tokens(config: Mapping[str, Any], special_map: Mapping[str, Any]) -> dict[str, str]:
    """The special token variables transformers passes a template: each ``*_token`` key of
    tokenizer_config.json (special_tokens_map.json's win only beside a tokenizer_config.json
    without added_tokens_decoder, as HfTokenizer reads them) and the named
    ``extra_special_tokens``, as strings ({"content": ...} too); null ones are left out."""
    old = "added_tokens_decoder" not in config
    merged = {**config, **special_map} if old else {**special_map, **config}
    extra = merged.get("extra_special_tokens")
    named = {k: v for k, v in merged.items() if k.endswith("_token")}
    named.update(extra if isinstance(extra, Mapping) else {})
    tokens = {}
    for key, value in named.items():
        value = value.get("content") if isinstance(value, Mapping) else value
        if isinstance(value, str):
            tokens[key] = value
    return tokens


class ChatTemplate:
    """A Jinja chat template, compiled, with the special token strings it is rendered with.

    Attributes:
      text: the template's Jinja source.
      source: where it was read from (a file path, for messages).
      special_tokens: template variable ('bos_token', ...) -> token string.
    """

    def __init__(
        self,
        text: str,
        *,
        source: str = "<string>",
        special_tokens: Mapping[str, str] | None = None,
    ):
        self.text, self.source = text, source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = _environment().from_string(text)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"{source}: the chat template is not valid Jinja (line {e.lineno}: "
                f"{_first_line(e).rstrip('.')}); copy it from the model's Hugging Face "
                "repository again."
            ) from None

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> ChatTemplate | None:
        """The chat template of a model directory (module docstring: which file), or None if it
        has none; raises ChatTemplateError if one is malformed."""
        directory = os.fspath(directory)
        if not os.path.isdir(directory):
            raise ChatTemplateError(f"{directory} is not a directory; point at a model directory.")
        config_path = os.path.join(directory, hf_tokenizer.TOKENIZER_CONFIG)
        try:
            config = hf_tokenizer._read_json(config_path)
            special_map = hf_tokenizer._read_json(
                os.path.join(directory, hf_tokenizer.SPECIAL_TOKENS_MAP)
            )
        except hf_tokenizer.TokenizerError as e:
            raise ChatTemplateError(str(e)) from None
        special_tokens = _special_tokens(config, special_map)
        path = os.path.join(directory, CHAT_TEMPLATE_FILE)
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError) as e:
                raise ChatTemplateError(f"{path} cannot be read ({_first_line(e)}).") from None
            return cls(text, source=path, special_tokens=special_tokens)
        text = config.get("chat_template")
        if text is None:
            return None
        where = f"{config_path}: chat_template"
        if isinstance(text, list):  # [{"name", "template"}, ...]: the one named "default".
            named = {t.get("name"): t.get("template") for t in text if isinstance(t, Mapping)}
            if "default" not in named:
                raise ChatTemplateError(
                    f"{where} names templates {sorted(map(str, named))} but none 'default'."
                )
            text = named["default"]
        if not isinstance(text, str):
            raise ChatTemplateError(f"{where} is a {type(text).__name__}, not a Jinja string.")
        return cls(text, source=where, special_tokens=special_tokens)

    def __repr__(self) -> str:
        return f"ChatTemplate({self.source!r}, special_tokens={self.special_tokens})"

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        """The conversation as text: transformers' ``apply_chat_template(messages,
        tokenize=False, add_generation_prompt=...)``.

        Args:
          messages: [M] mappings with 'role' and 'content' ([] renders what the template
            writes before any message).
          add_generation_prompt: append the header that starts an assistant turn.
        """
        plain = _messages(messages)
        try:
            return self._template.render(
                messages=plain, add_generation_prompt=add_generation_prompt, **self.special_tokens
            )
        except Exception as e:  # The template is code: whatever it raises is its error.  # noqa: BLE001
            raise ChatTemplateError(
                f"{self.source}: the chat template raised {type(e).__name__} on {len(plain)} "
                f"messages: {_first_line(e)}"
            ) from None


def encode_chat(
    tokenizer: HfTokenizer,
    template: ChatTemplate | None,
    messages: Sequence[Mapping[str, Any]],
) -> tuple[list[int], list[int]]:
    """A conversation's token ids [T] and its 0/1 loss weights [T] (module docstring).

    ids are transformers' ``apply_chat_template(messages, tokenize=True)`` ids; a weight is 1
    exactly on the tokens of the assistant turns: their content and what follows it up to and
    including the end-of-turn token, not the role header before it. Raises ChatTemplateError
    without a template (``template`` None) or where rendering fails, and ChatBoundaryError where
    a token straddles the start or end of an assistant turn. Cost: per assistant turn, two
    more renderings and two tokenizations of a prefix of the text.
    """
    if template is None:
        raise ChatTemplateError(
            f"{tokenizer.directory} has no chat template ({CHAT_TEMPLATE_FILE}, or chat_template "
            "in tokenizer_config.json); use an instruct model's directory, or give one."
        )
    text = template.render(messages)
    ids = tokenizer.encode(text, add_special_tokens=False)
    weights = [0] * len(ids)
    for i, message in enumerate(messages):
        if message["role"] != _ASSISTANT:
            continue
        header = template.render(messages[:i], add_generation_prompt=True)
        turn = template.render(messages[: i + 1])
        where = f"{template.source}: turn {i} (assistant)"
        if not text.startswith(turn):
            raise ChatTemplateError(
                f"{where}: messages[:{i + 1}] alone render otherwise than they begin the whole "
                "conversation (does the template rewrite earlier turns?): no tokens to weight."
            )
        if not turn.startswith(header):
            raise ChatTemplateError(
                f"{where}: messages[:{i}] with add_generation_prompt=True do not render the start "
                "of the turn (the generation prompt is not the header the template writes)."
            )
        start, end = len(header), max(len(header), len(turn.rstrip()))
        first = _tokens_before(tokenizer, text, ids, start, f"turn {i} (assistant): its start")
        last = _tokens_before(tokenizer, text, ids, end, f"turn {i} (assistant): its end")
        weights[first:last] = [1] * (last - first)
    return ids, weights


def _tokens_before(tokenizer: HfTokenizer, text: str, ids: list[int], x: int, where: str) -> int:
    """n(x): how many of ``ids`` (of ``text``) hold ``text[:x]`` (module docstring)."""
    prefix = tokenizer.encode(text[:x], add_special_tokens=False)
    if ids[: len(prefix)] != prefix:
        raise ChatBoundaryError(
            f"{where} (character {x}, between {text[max(0, x - 12) : x]!r} and "
            f"{text[x : x + 12]!r}) is straddled by a token: the tokenizer merges across it, so "
            "the turn's tokens cannot be weighted exactly."
        )
    return len(prefix)
