"""What a job directory records about its run, read back without the trainer's flags:
its knobs (config.txt), the Hugging Face model files a run fine-tuned from one keeps
(:data:`HF_MODEL_DIR`) and, for a run that froze parameters (``paxlite.train.trainable``), the
loading rules its frozen parameters came from (frozen_start.json).

``paxlite.runtime.job_config`` writes these files; readers (``paxlite.pretrained.export``,
``paxlite.pretrained.loading``, ``paxlite.checkpoints.init_from``) come here.
"""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from etils import epath

from paxlite.experiments.tasks_lib import CheckpointLoadingRules
from paxlite.train import trainable

#: The directory where a job fine-tuned from a Hugging Face model keeps that model's files
#: (config.json, generation config, tokenizer; not its weights): an experiment's
#: ``job_files`` (``paxlite.pretrained.export.kept_files``) or ``job_texts`` write them.
HF_MODEL_DIR = "hf_model"


def read_knobs(job_log_dir: epath.Path) -> dict[str, Any]:
    """The knobs a job's config.txt records (``KNOB: type = value`` lines of its Knobs
    section), each value as a Python literal where it is one, else its text; {} without
    a config.txt."""
    path = epath.Path(job_log_dir) / "config.txt"
    lines = path.read_text().splitlines() if path.is_file() else []
    knobs: dict[str, Any] = {}
    for line in lines[lines.index("## Knobs") + 1 :] if "## Knobs" in lines else []:
        if line.startswith("## "):
            break
        name, _, rest = line.partition(": ")
        text = rest.partition(" = ")[2]
        try:
            knobs[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            knobs[name] = text
    return knobs


#: Where a run that froze parameters records how it started them (written at step 0).
FROZEN_START_FILE = "frozen_start.json"


@dataclasses.dataclass(frozen=True)
class FrozenStart:
    """How a job that froze parameters holds them: its learner's regexes (praxis's
    ``bprop_variable_inclusion`` / ``_exclusion``) and the loading rules it started from
    (the frozen parameters' values: its checkpoints hold only what it trained; none for
    parameters it initialised from its seed).

    Attributes:
      inclusion, exclusion: the learner's regexes (one of the two is empty).
      rules: ``{path: CheckpointLoadingRules}`` as the run resolved them at step 0.
    """

    inclusion: tuple[str, ...]
    exclusion: tuple[str, ...]
    rules: dict[str, CheckpointLoadingRules]

    def trained_rules(self) -> CheckpointLoadingRules:
        """Rules that load from this job's checkpoints exactly what it trained."""
        if self.inclusion:  # The whole name: the regexes need only match its start.
            return CheckpointLoadingRules(
                load_rules=[(f"((?:{p}).*)", "{}") for p in self.inclusion]
            )
        return CheckpointLoadingRules(ignore_rules=list(self.exclusion))


def write_frozen_start(
    job_log_dir: epath.Path, learner: Any, rules: Mapping[str, CheckpointLoadingRules]
) -> None:
    """Records :class:`FrozenStart` in the job directory (call once, at step 0, process 0)."""
    fields = {
        "inclusion": list(trainable.patterns_of(learner.bprop_variable_inclusion)),
        "exclusion": list(trainable.patterns_of(learner.bprop_variable_exclusion)),
        "rules": {
            path: {
                "step": rule.step,
                "load_rules": [list(r) for r in rule.load_rules],
                "ignore_rules": list(rule.ignore_rules) if rule.ignore_rules else None,
            }
            for path, rule in rules.items()
        },
    }
    path = epath.Path(job_log_dir) / FROZEN_START_FILE
    path.write_text(json.dumps(fields, indent=2) + "\n")


def frozen_start(job_log_dir: epath.Path) -> FrozenStart | None:
    """The job's recorded :class:`FrozenStart`; None for a job that froze nothing."""
    path = epath.Path(job_log_dir) / FROZEN_START_FILE
    if not path.is_file():
        return None
    fields = json.loads(path.read_text())
    rules = {
        source: CheckpointLoadingRules(
            step=rule["step"],
            load_rules=[tuple(r) for r in rule["load_rules"]],
            ignore_rules=rule["ignore_rules"],
        )
        for source, rule in fields["rules"].items()
    }
    return FrozenStart(tuple(fields["inclusion"]), tuple(fields["exclusion"]), rules)
