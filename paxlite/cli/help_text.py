"""``paxlite --help`` (paxlite's flags, by group) and ``--help_knobs --exp=NAME`` (an
experiment's knobs: type, value and what each does, by the class that declares them).

``--helpfull`` stays absl's: every flag of every library paxlite imports.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

from paxlite.cli.flags import FLAGS, UsageError
from paxlite.experiments import base_experiment, registry

#: paxlite's flags as --help shows them: (group, flags). Pax's own names (paxml 1.4's
#: main.py) sit in the group of what they do.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "What to run",
        ("exp", "mode", "set", "fdl_set", "fiddler", "print_config", "help_knobs"),
    ),
    ("Where", ("job_log_dir", "exp_search_packages", "tfds_data_dir")),
    (
        "Checkpoints",
        (
            "init_from",
            "init_from_exp",
            "restore_checkpoint_dir",
            "restore_checkpoint_step",
            "restore_fallback",
            "stop_at_step",
        ),
    ),
    (
        "Scale: several processes, TPU slices",
        (
            "coordinator_address",
            "num_processes",
            "process_id",
            "multiprocess_gpu",
            "server_addr",
            "num_hosts",
            "host_idx",
            "distributed_timeout_s",
            "peer_timeout_s",
            "compile_topology",
            "compile_topology_num_slices",
            "xla_gpu_defaults",
        ),
    ),
    (
        "Output and measurement",
        ("peak_tflops", "mfu_definition", "bench_steps", "bench_warmup", "jax_profiler_port"),
    ),
)
_ATTRIBUTE = re.compile(r"^ {2}([A-Z][A-Z0-9_]*(?:, [A-Z][A-Z0-9_]*)*): (.*)$")
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!etc)[.;](\s|$)")
_REPEATABLE = re.compile(r"\.?; repeat this option to specify a list of values")
_CHOICES = re.compile(r"<([^>]*)>: ")


def listed_flags() -> list[str]:
    """The flags --help lists, in its order."""
    return [name for _, names in GROUPS for name in names if name in FLAGS]


def flags_help(init_from_reads: str = "") -> str:
    """paxlite's flags by group, each with its default and the first sentence of its help;
    ``init_from_reads``: the checkpoint kinds --init_from reads (the checkpoints package's
    registry, which paxlite.cli does not import)."""
    lines = [
        "paxlite --exp=NAME --job_log_dir=DIR [--mode=train] [--set KNOB=VALUE ...]",
        "",
        "An experiment's knobs: paxlite --help_knobs --exp=NAME. Every flag of every library: "
        "--helpfull.",
    ]
    for title, names in GROUPS:
        lines += ["", f"{title}:"]
        for name in names:
            if name in FLAGS:
                lines.append(_flag_line(name, init_from_reads))
    return "\n".join(lines)


def _flag_line(name: str, init_from_reads: str) -> str:
    """``  --name=default  what it does`` (its help's first sentence; a flag with choices
    lists them; --init_from the checkpoint kinds it reads)."""
    flag = FLAGS[name]
    default = "" if flag.default in (None, [], "") else f"={flag.default_as_str.strip(chr(39))}"
    text = _REPEATABLE.sub(" (repeatable)", " ".join(flag.help.split()))
    choices = _CHOICES.match(text)
    if choices:  # absl puts an enum's choices first: keep them, then one sentence.
        text = f"{first_sentence(text[choices.end() :])} One of: {choices.group(1)}."
    else:
        text = first_sentence(text)
    if name == "init_from" and init_from_reads:
        text += f" Reads: {init_from_reads}."
    return f"  --{name}{default}  {text}"


def knobs_help(exp: str | None, search_packages: Sequence[str]) -> str:
    """Experiment ``exp``'s knobs, grouped by the class that declares them (most general
    first): ``NAME: type = value`` and the first sentence of its docstring entry.

    Raises:
      UsageError: no --exp given.
      ExperimentRegistryError: no such experiment (with the closest names).
    """
    if not exp:
        raise UsageError("--help_knobs lists an experiment's knobs: add --exp=NAME.")
    cls = registry.get(exp, search_packages)
    values = base_experiment.knobs(cls)
    lines = [f"{registry.experiment_name(cls)}: its knobs (--set KNOB=VALUE), by group."]
    for declaring in reversed(cls.__mro__):
        declared = [n for n in vars(declaring).get("__annotations__", {}) if n in values]
        if not declared:
            continue
        docs = attribute_docs(declaring)
        summary, *body = _without_attributes(inspect.getdoc(declaring) or "").split("\n")
        lines += ["", f"{declaring.__name__}: {summary}"]
        lines += [f"    {line}" for line in body if line.strip()]  # The group's own words.
        for name in declared:
            tp, value = values[name]
            shown = "<required>" if value is base_experiment.MISSING else repr(value)
            lines.append(f"  {name}: {base_experiment.type_name(tp)} = {shown}")
            if name in docs:
                lines.append(f"      {docs[name]}")
    return "\n".join(lines)


def _without_attributes(doc: str) -> str:
    """A docstring less its "Attributes:" section (whose entries go with each knob)."""
    return doc.split("\nAttributes:")[0].rstrip()


def attribute_docs(cls: type) -> dict[str, str]:
    """``{KNOB: the first sentence of its entry}`` from the "Attributes:" section of
    ``cls``'s own docstring (an entry may name several knobs: ``A, B: ...``)."""
    docs: dict[str, str] = {}
    names: list[str] = []
    # cleandoc: Python 3.13 dedents docstrings itself, earlier ones keep the source's indent.
    for line in inspect.cleandoc(cls.__doc__ or "").splitlines():
        found = _ATTRIBUTE.match(line)
        if found:
            names = found.group(1).split(", ")
            text = found.group(2)
        elif names and line.startswith(" " * 4) and line.strip():
            text = docs[names[0]] + " " + line.strip()
        else:
            names = []
            continue
        for name in names:
            docs[name] = text
    return {name: first_sentence(text) for name, text in docs.items()}


def first_sentence(text: str) -> str:
    """``text`` up to its first full stop outside parentheses (not an ``e.g.``'s), a ``;``
    ending it as one."""
    for end in _SENTENCE_END.finditer(text):
        depth = text.count("(", 0, end.start()) - text.count(")", 0, end.start())
        if depth <= 0:
            return text[: end.start()] + "."
    return text
