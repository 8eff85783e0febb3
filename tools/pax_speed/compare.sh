#!/usr/bin/env bash
# paxml 1.4.0's own main.py against paxlite's on LmCloudSpmd2B shrunk (tools/pax_speed/
# shrunk_2b.py), one after the other in ROUNDS alternating rounds (two venvs: no one process
# can hold both). Prints each run's steps/s after the first 10 steps (both log every 10).
#
#   tools/pax_fixtures/make_venv.sh /tmp/paxml-venv
#   tools/pax_speed/compare.sh /tmp/paxml-venv .venv [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
pax_venv=$1 paxlite_venv=$2 rounds=${3:-2}
out=$(mktemp -d)
knobs=(NUM_LAYERS=2 MODEL_DIMS=256 HIDDEN_DIMS=1024 NUM_HEADS=4 DIMS_PER_HEAD=64
  VOCAB_SIZE=32000 MAX_SEQ_LEN=256 PERCORE_BATCH_SIZE=8 ICI_MESH_SHAPE=1,1,1
  FPROP_DTYPE=float32 NUM_TRAIN_STEPS=60 SUMMARY_INTERVAL_STEPS=10
  CHECKPOINT_EVERY_N_STEPS=1000000)
sets=()
for k in "${knobs[@]}"; do sets+=(--set "$k"); done
export JAX_PLATFORMS=cpu
for round in $(seq "$rounds"); do
  "$pax_venv/bin/python" -m paxml.main --exp=tools.pax_speed.shrunk_2b.LmCloudSpmd2BShrunk \
    --job_log_dir="$out/pax$round" --mode=train >"$out/pax$round.log" 2>&1
  echo "round $round paxml   steps/s:" $(grep -o 'programs.py:[0-9]*\] steps/sec: [0-9.]*' \
    "$out/pax$round.log" | awk '{print $NF}' | tail -n +2)
  "$paxlite_venv/bin/python" -m paxlite.main --exp=tasks.lm.lm_cloud.LmCloudSpmd2B \
    --job_log_dir="$out/paxlite$round" --mode=train "${sets[@]}" >"$out/paxlite$round.log" 2>&1
  echo "round $round paxlite steps/s:" $(grep -o '[0-9.]* steps/s' "$out/paxlite$round.log" \
    | awk '{print $1}' | tail -n +2)
done
rm -rf "$out"
