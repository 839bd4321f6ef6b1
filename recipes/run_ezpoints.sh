#!/usr/bin/env bash
# GiGPO on ezpoints from images with the settings of the reference implementation's run (verl-agent
# examples/gigpo_trainer/run_ezpoints.sh): the cards drawn by environments/cards/, a vision-language model, no history,
# state anchor keys. Every value, its source and each deliberate deviation: recipes/reference_settings.yaml
# (docs/fidelity.md); the defaults: recipes/recipe_defaults.py; the variables: docs/gpu.md.
#
#   bash recipes/run_ezpoints.sh
#   OBSERVATION=text MODEL_PATH=Qwen/Qwen2.5-1.5B-Instruct bash recipes/run_ezpoints.sh   # the text variant, a text model
#   DEVICE=cpu bash recipes/run_ezpoints.sh   # verl's pipeline on this CPU with the tiny vision model (built when missing)
#   DRY_RUN=1 bash recipes/run_ezpoints.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
gigpo_recipe ezpoints "$@"
