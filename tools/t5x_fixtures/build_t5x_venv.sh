#!/usr/bin/env bash
# Builds a side venv with T5X (not on PyPI), for the fixture makers that run T5X itself.
#   tools/t5x_fixtures/build_t5x_venv.sh SIDE T5X_SRC AIRIO_SRC JESTIMATOR_SRC
# SIDE: where the venv goes (SIDE/venv); *_SRC: source trees of google-research/t5x,
# google/airio and google-research/jestimator (fetched; never committed here). On pyenv's
# Python 3.11 with the versions ../shared/STACK-NOTES.md records; about 5 minutes.
set -euxo pipefail
SIDE=$1 T5X_SRC=$2 AIRIO_SRC=$3 JESTIMATOR_SRC=$4
PYTHON=${PYTHON:-$(ls -d "$(pyenv root)"/versions/3.11.* | tail -n 1)/bin/python}
mkdir -p "$SIDE"
"$PYTHON" -m venv "$SIDE/venv"
P=$SIDE/venv/bin/python
$P -m pip install -q --upgrade pip
cat > "$SIDE/constraints.txt" <<'C'
jax==0.10.2
jaxlib==0.10.2
flax==0.12.8
optax==0.2.8
orbax-checkpoint==0.12.4
tensorstore==0.1.85
tensorflow-cpu==2.21.0
C
$P -m pip install -q -r "$SIDE/constraints.txt"
$P -m pip install -q --no-deps seqio==0.0.20 'tensorflow-text==2.21.*' "$JESTIMATOR_SRC"
$P -m pip install -q -c "$SIDE/constraints.txt" clu fiddle gin-config pyglove editdistance \
  tensorflow-datasets grain cached_property chex jaxtyping ml-collections tensorboard sentencepiece
$P -m pip install -q --no-deps -e "$AIRIO_SRC" -e "$T5X_SRC"
# T5's package, for the user directory's `from t5.evaluation import metrics`.
$P -m pip install -q --no-deps t5==0.9.4
$P -m pip install -q -c "$SIDE/constraints.txt" babel sacrebleu scikit-learn rouge-score
JAX_PLATFORMS=cpu $P -c "import t5x.train; from t5.evaluation import metrics"
