#!/usr/bin/env bash
# The paxml 1.4.0 venv that tools/pax_fixtures/*.py run in (never paxlite's venv or CI).
# paxml/praxis 1.4.0 pin jaxlib 0.4.26, which has no wheel for Python >= 3.11: Python 3.10
# (pyenv's 3.10.13 here) and pip 24.0 (newer pips reject paxml's metadata). About 4 minutes.
#
#   tools/pax_fixtures/make_venv.sh /tmp/paxml-venv
#   JAX_PLATFORMS=cpu /tmp/paxml-venv/bin/python tools/pax_fixtures/param_trees.py \
#       tests/fixtures/pax/param_trees.json
set -euo pipefail
venv="${1:-/tmp/paxml-venv}"
python310="${PYTHON310:-$(pyenv root 2>/dev/null)/versions/3.10.13/bin/python}"
"$python310" -m venv "$venv"
"$venv/bin/python" -m pip install -q "pip==24.0"
"$venv/bin/pip" install -q "paxml==1.4.0" "praxis==1.4.0" "jax==0.4.26" "jaxlib==0.4.26"
# tpu_memory/lower_pax.py lowers Pax's train step for a TPU topology: libtpu 0.0.1 (PyPI's
# oldest) only describes the topology there (ENABLE_PJRT_COMPATIBILITY=1); it compiles nothing.
"$venv/bin/pip" install -q "libtpu==0.0.1"
"$venv/bin/python" -c "import paxml, praxis; print('paxml venv ready:', '$venv')"
