#!/usr/bin/env bash
# Runs T5X's own train.py on tests/fixtures/t5x/user_dir (T5X's README user directory) and
# keeps what T5X wrote as the oracle of paxlite's T5X command (tests/paxlite/t5x/test_train.py):
#   tools/t5x_fixtures/run_t5x_user_dir.sh SIDE T5X_SRC [OUT]
# SIDE: the venv of build_t5x_venv.sh; T5X_SRC: the T5X source tree (its own gin files are
# included, not paxlite's copies); OUT: default tests/fixtures/t5x/user_dir_runs.
set -euxo pipefail
SIDE=$1 T5X_SRC=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${3:-$REPO/tests/fixtures/t5x/user_dir_runs}
USER_DIR=$REPO/tests/fixtures/t5x/user_dir
WORK=$(mktemp -d)
export JAX_PLATFORMS=cpu PYTHONPATH=$USER_DIR
train() {  # name, then flags
  local name=$1; shift
  "$SIDE/venv/bin/python" -m t5x.train --gin_search_paths="$USER_DIR,$T5X_SRC" \
    --gin.MODEL_DIR=\""$WORK/$name"\" "$@" --alsologtostderr > "$WORK/$name.log" 2>&1
  cp "$WORK/$name/config.gin" "$OUT/${name}_config.gin"
}
mkdir -p "$OUT"
train scratch --gin_file=scratch.gin
# The fixture checkpoint's Adafactor state factors its 32-wide kernels (T5X's default
# min_dim_size_to_factor is 128): T5X restores it with the size told.
train finetune --gin_file=finetune.gin \
  --gin.INITIAL_CHECKPOINT_PATH=\""$REPO/tests/fixtures/t5x/flan_legacy/checkpoint_7"\" \
  --gin.seqio.SentencePieceVocabulary.sentencepiece_model_file=\""$USER_DIR/spiece.model"\" \
  --gin.adafactor.Adafactor.min_dim_size_to_factor=32
echo "wrote $OUT; T5X's logs in $WORK"
