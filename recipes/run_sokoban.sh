#!/usr/bin/env bash
# GiGPO on Sokoban (6x6 rooms, 1 box) with the settings of the reference implementation's run (verl-agent
# examples/gigpo_trainer/run_sokoban.sh): the room as an image (16 pixels a cell) for Qwen2.5-VL-3B-Instruct, no
# history, state anchor keys, group size 8, 32 tasks per iteration, at most 15 steps, gamma 0.95, w = 1, norm "mean",
# lr 1e-6, KL loss 0.01, entropy 0.001, invalid-action penalty 0.1, 64 step rows per optimizer step, 150 iterations,
# validation every 5. OBSERVATION=text plays the text grid with a text model (Qwen2.5-1.5B-Instruct, history 2).
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md);
# the defaults: recipes/recipe_defaults.py; the variables: docs/gpu.md.
#
#   bash recipes/run_sokoban.sh
#   ADV_ESTIMATOR=grpo bash recipes/run_sokoban.sh
#   DYNAMIC=episode bash recipes/run_sokoban.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   OBSERVATION=text MODEL_PATH=Qwen/Qwen2.5-0.5B-Instruct N_GPUS=1 TOTAL_ITERS=3 bash recipes/run_sokoban.sh   # quick GPU check
#   OBSERVATION=text bash recipes/run_sokoban.sh   # the text grid, for text models (MODEL_PATH sets another)
#   DEVICE=cpu bash recipes/run_sokoban.sh   # verl's pipeline on this CPU, the tiny vision model (built when missing)
#   OBSERVATION=text MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_sokoban.sh   # ... the tiny text model
#   DRY_RUN=1 bash recipes/run_sokoban.sh
#   LOGGER=console,file,wandb bash recipes/run_sokoban.sh   # also log to wandb (or tensorboard)
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
gigpo_recipe sokoban "$@"
