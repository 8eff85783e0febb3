#!/usr/bin/env bash
# The venv that tools/hf_fixtures/make_fixtures.py runs in, by hand (never paxlite's venv or CI).
# Python >= 3.11; torch 2.15.0, transformers 5.24.0, tokenizers 0.23.3, safetensors 0.8.0,
# sentencepiece 0.2.3, peft 0.21.2, numpy 2.4.6, and protobuf 7.36.2 (transformers 5 needs it to
# convert a SentencePiece tokenizer.model). PyPI's torch brings its CUDA wheels (about 5.6 GB,
# a few minutes); the fixtures only use the CPU.
#
#   tools/hf_fixtures/make_venv.sh /tmp/hf-venv
#   /tmp/hf-venv/bin/python tools/hf_fixtures/make_fixtures.py tests/fixtures/hf
set -euo pipefail
venv="${1:-/tmp/hf-venv}"
python311="${PYTHON311:-python3.11}"
"$python311" -m venv "$venv"
"$venv/bin/pip" install -q "torch==2.15.0" "transformers==5.24.0" "tokenizers==0.23.3" \
    "safetensors==0.8.0" "sentencepiece==0.2.3" "peft==0.21.2" "numpy==2.4.6" "protobuf==7.36.2"
"$venv/bin/python" -c "import torch, transformers; print('hf venv ready:', '$venv', \
torch.__version__, transformers.__version__)"
