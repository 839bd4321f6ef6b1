#!/usr/bin/env bash
# GiGPO on ALFWorld as the paper's reference implementation runs it (verl-agent examples/gigpo_trainer/
# run_alfworld.sh, Qwen2.5-1.5B-Instruct): group size 8, 16 tasks per iteration, at most 50 steps, gamma 0.95, w = 1,
# mean_std, history 2, lr 1e-6, KL loss 0.01 (low_var_kl), entropy 0.001, invalid-action penalty 0.1, 256 step rows
# per optimizer step, 150 iterations, validation every 5 iterations on valid_seen (temperature 0.4, sampled).
# Every value, its source and each deliberate deviation: recipes/reference_settings.yaml (docs/fidelity.md);
# the defaults: recipes/recipe_defaults.py; the variables: docs/gpu.md.
#
#   ALFWORLD_DATA=~/.cache/alfworld bash recipes/run_alfworld.sh
#   ADV_ESTIMATOR=grpo bash recipes/run_alfworld.sh        # the paper's GRPO baseline on the same settings
#   ADV_ESTIMATOR=hgpo bash recipes/run_alfworld.sh        # HGPO as its authors ran it (also graphgpo, g2po)
#   DYNAMIC=episode bash recipes/run_alfworld.sh   # the reference's dynamic GiGPO (DYNAMIC=signal: step credit too)
#   MODEL_PATH=artifacts/tiny-model DEVICE=cpu bash recipes/run_alfworld.sh   # verl's pipeline on this CPU, tiny model
#   LORA_RANK=64 MODEL_PATH=Qwen/Qwen2.5-7B-Instruct bash recipes/run_alfworld.sh   # the reference's LoRA run (7B)
#   DRY_RUN=1 bash recipes/run_alfworld.sh                 # print the final command only
#   bash recipes/run_alfworld.sh trainer.total_training_steps=10   # extra Hydra overrides go last
#   LOGGER=console,file,wandb bash recipes/run_alfworld.sh   # also log to wandb (or tensorboard)
#
# ALFWORLD_DATA: the real games (`alfworld-download` on a machine with GitHub access), or synthetic ones from
# `python -m environments.alfworld.synth --out DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."
source recipes/common.sh
gigpo_recipe alfworld "$@"
