"""Makes tests/fixtures/t5x/t5x_run/t5x_resumes_paxlite.json: T5X's own `t5x.train` resuming
a MODEL_DIR that paxlite's `paxlite.t5x.train` wrote (issue 58: paxlite's checkpoint_<step>
is T5X's checkpoint format, read by T5X's own restore).

Run it with the side venv of build_t5x_venv.sh, after make_t5x_run.py made the fixture:

    /tmp/t5x_side/venv/bin/python tools/t5x_fixtures/make_t5x_resume.py T5X_SRC \
        [--paxlite_python .venv/bin/python] [--out tests/fixtures/t5x/t5x_run]

1. paxlite (its own venv, ``--paxlite_python``) runs the fixture's fine-tuning command
   (finetune.gin from init_checkpoint/checkpoint_3 to TRAIN_STEPS) into a temporary
   MODEL_DIR: checkpoint_<step>/ in T5X's format.
2. T5X runs the same command with ``--gin.TRAIN_STEPS=RESUMED_STEPS`` in that MODEL_DIR: its
   checkpoint takes precedence over INITIAL_CHECKPOINT_PATH, so T5X restores paxlite's last
   checkpoint (parameters, Adafactor state, step) and trains on; finetune.gin keeps no
   dataset state, so the data starts again from batch 0.
3. Writes every scalar T5X logged after the restored step, the log lines of its restore,
   and the commits and versions. A test resumes paxlite the same way and compares.

Takes about 2 minutes on 2 CPU cores.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_t5x_run as run_maker  # noqa: E402

OUT_FILE = "t5x_resumes_paxlite.json"
RESUMED_STEPS = 9  # Two steps past the fine-tuning run's TRAIN_STEPS (7).


def paxlite_command(python, user_dir, model_dir, init_checkpoint):
    return [
        python,
        "-m",
        "paxlite.t5x.train",
        "--gin_file=finetune.gin",
        f"--gin_search_paths={user_dir}",
        f'--gin.MODEL_DIR="{model_dir}"',
        f'--gin.seqio.SentencePieceVocabulary.sentencepiece_model_file="{user_dir}/spm.model"',
        f'--gin.INITIAL_CHECKPOINT_PATH="{init_checkpoint}"',
    ]


def run_paxlite(cmd, user_dir, log_path, commands):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=user_dir, PYTHONDONTWRITEBYTECODE="1")
    env.pop("VIRTUAL_ENV", None)
    commands.append(shlex.join(cmd))
    print("+", shlex.join(cmd), f"> {log_path} 2>&1", flush=True)
    with open(log_path, "w") as log:
        proc = subprocess.run(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=run_maker.REPO
        )
    if proc.returncode:
        sys.exit(f"paxlite failed ({proc.returncode}); see {log_path}")


def restore_lines(log_path):
    """What T5X logged about where it restored from and the steps it trained."""
    keys = ("Restoring", "restore", "Starting main loop", "Saving checkpoint")
    with open(log_path) as log:
        return [line.strip()[:300] for line in log if any(k in line for k in keys)]


def paxlite_commit():
    return subprocess.run(
        ["git", "-C", run_maker.REPO, "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("t5x_src")
    default_python = os.path.join(run_maker.REPO, ".venv", "bin", "python")
    parser.add_argument("--paxlite_python", default=default_python)
    parser.add_argument("--out", default=run_maker.DEFAULT_OUT)
    args = parser.parse_args()
    t5x_src = os.path.abspath(args.t5x_src)
    user_dir = os.path.join(args.out, "user_dir")
    init_step = f"checkpoint_{run_maker.INIT_STEPS}"
    init_checkpoint = os.path.join(args.out, "init_checkpoint", init_step)
    tmp = tempfile.mkdtemp(prefix="t5x_resume_")  # Kept (with the logs) if a run fails.
    record = _resume(args.paxlite_python, t5x_src, user_dir, init_checkpoint, tmp)
    with open(os.path.join(args.out, OUT_FILE), "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    shutil.rmtree(tmp)
    print("wrote", os.path.join(args.out, OUT_FILE))


def _resume(paxlite_python, t5x_src, user_dir, init_checkpoint, tmp):
    """paxlite's run into TMP/model, then T5X's resume of it: the record to write."""
    commands = []
    model_dir = os.path.join(tmp, "model")
    cmd = paxlite_command(paxlite_python, user_dir, model_dir, init_checkpoint)
    run_paxlite(cmd, user_dir, os.path.join(tmp, "paxlite.log"), commands)
    paxlite_steps = sorted(os.listdir(model_dir))
    extra = [f'--gin.INITIAL_CHECKPOINT_PATH="{init_checkpoint}"']
    extra.append(f"--gin.TRAIN_STEPS={RESUMED_STEPS}")
    cmd = run_maker.t5x_train_command(user_dir, t5x_src, "finetune.gin", model_dir, extra)
    t5x_log = os.path.join(tmp, "t5x.log")
    run_maker.run_t5x(cmd, user_dir, t5x_log, commands)
    scalars = run_maker.read_scalars(model_dir)
    after = {
        tag: {s: v for s, v in steps.items() if int(s) > run_maker.TRAIN_STEPS}
        for tag, steps in scalars.items()
    }
    return {
        "note": (
            f"T5X resumed paxlite's MODEL_DIR (checkpoint_{run_maker.TRAIN_STEPS} written by "
            f"paxlite.t5x.train) and trained to step {RESUMED_STEPS}; metrics are T5X's "
            "scalars after the restored step"
        ),
        "resumed_from": run_maker.TRAIN_STEPS,
        "train_steps": RESUMED_STEPS,
        "paxlite_model_dir": [p for p in paxlite_steps if p.startswith("checkpoint_")],
        "t5x_log": restore_lines(t5x_log),
        "metrics": {tag: steps for tag, steps in after.items() if steps},
        "commands": [c.replace(tmp, "TMP") for c in commands],
        "t5x_commit": run_maker.t5x_commit(t5x_src),
        "paxlite_commit": paxlite_commit(),
        "versions": run_maker.versions(),
    }


if __name__ == "__main__":
    main()
