#!/usr/bin/env bash
# GiGPO on search-augmented QA with the settings of the reference implementation's run (verl-agent
# examples/gigpo_trainer/run_search.sh): group size 5, 256 questions per iteration, at most 4 turns, history 4,
# similarity anchor keys at threshold 0.9 (observations are free text: retrieved passages), gamma 0.95, w = 1,
# mean_std, lr 1e-6 with 10% warm-up, KL loss 0.001, no entropy bonus, invalid-action penalty 0.01, 512 step rows
# per optimizer step, greedy validation every 50 iterations.
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md);
# the defaults: recipes/recipe_defaults.py; the variables: docs/gpu.md.
#
#   bash recipes/run_search.sh                                    # embedded BM25 over the generated corpus
#   RETRIEVER_URL=http://127.0.0.1:8000 bash recipes/run_search.sh   # a Search-R1-style retrieval server
#   ADV_ESTIMATOR=grpo bash recipes/run_search.sh
#   DYNAMIC=episode bash recipes/run_search.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_search.sh   # verl's pipeline on this CPU, tiny model
#   DRY_RUN=1 bash recipes/run_search.sh
#   LOGGER=console,file,wandb bash recipes/run_search.sh   # also log to wandb (or tensorboard)
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
gigpo_recipe search "$@"
