#!/usr/bin/env bash
# GiGPO on WebShop as the paper's reference implementation runs it (verl-agent examples/gigpo_trainer/
# run_webshop.sh, Qwen2.5-1.5B-Instruct): group size 8, 16 tasks per iteration, at most 15 steps, gamma 0.95, w = 1,
# norm "mean" (no std division), history 2, lr 1e-6, KL loss 0.01 (low_var_kl), entropy 0.001, invalid-action
# penalty 0.1, 64 step rows per optimizer step, 150 iterations; validation every 5 iterations on goals 0-499.
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md);
# the defaults: recipes/recipe_defaults.py; the variables: docs/gpu.md.
#
#   bash recipes/run_webshop.sh                          # the project's WebShop-style simulator (no downloads)
#   WEBSHOP_ENV=webshop_real bash recipes/run_webshop.sh  # a real WebShop installation (web_agent_site importable)
#   ADV_ESTIMATOR=grpo bash recipes/run_webshop.sh       # the GRPO baseline on the same settings
#   ADV_ESTIMATOR=hgpo bash recipes/run_webshop.sh       # HGPO as its authors ran it (also graphgpo, g2po)
#   DYNAMIC=episode bash recipes/run_webshop.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_webshop.sh   # verl's pipeline on this CPU, tiny model
#   LORA_RANK=64 MODEL_PATH=Qwen/Qwen2.5-7B-Instruct bash recipes/run_webshop.sh   # the reference's LoRA run (7B)
#   DRY_RUN=1 bash recipes/run_webshop.sh                # print the final command only
#   LOGGER=console,file,wandb bash recipes/run_webshop.sh   # also log to wandb (or tensorboard)
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
gigpo_recipe webshop "$@"
