"""verl-gigpo: GiGPO (Group-in-Group Policy Optimization, arXiv 2505.10978) for multi-turn LLM agents on verl 0.9.1.

Importing this package is cheap (no verl, no torch). The pieces:

* :mod:`verl_gigpo.advantage` — the estimators (pure maths: GiGPO, HGPO, GraphGPO, G2PO);
  :mod:`verl_gigpo.advantage.anchors` — anchor keys and similarity grouping; :mod:`verl_gigpo.config` —
  :class:`~verl_gigpo.config.GiGPOConfig`;
* :mod:`verl_gigpo.plugin` — verl plug-in (estimators ``"gigpo"``, ``"hgpo"``, ``"graphgpo"``, ``"g2po"``, agent
  loop ``"gigpo_env_agent"``, trainer mode ``"gigpo_sync"``); :mod:`verl_gigpo.main` — ``python -m verl_gigpo.main``,
  which checks the config (:mod:`verl_gigpo.verl_glue.preflight`) and prepares the experiment folder
  (:mod:`verl_gigpo.verl_glue.launch`: resume, checkpoints, the metrics file of
  :mod:`verl_gigpo.verl_glue.metrics_file`) before verl starts Ray;
* :mod:`verl_gigpo.rollout` — the episode runner shared by both engines; :mod:`verl_gigpo.local` — the embedded
  single-machine engine.
* :mod:`verl_gigpo.export` — ``python -m verl_gigpo.export CKPT --out DIR``: a checkpoint of either engine as a
  Hugging Face folder (a LoRA adapter merged in: :mod:`verl_gigpo.export.lora`).
"""

__version__ = "0.1.0"

#: name of the advantage estimator registered into verl (``algorithm.adv_estimator=gigpo``)
ESTIMATOR_NAME = "gigpo"
#: every step-credit estimator registered into verl and run by the trainer mode and the local engine: GiGPO and
#: its successors HGPO, GraphGPO and G2PO (``algorithm.adv_estimator=<name>``, options in ``algorithm.<name>``)
STEP_CREDIT_ESTIMATORS = ("gigpo", "hgpo", "graphgpo", "g2po")
#: name of the agent loop registered into verl (``actor_rollout_ref.rollout.agent.default_agent_loop``)
AGENT_LOOP_NAME = "gigpo_env_agent"
#: name of the V1 trainer mode registered into verl (``trainer.v1.trainer_mode``)
TRAINER_MODE = "gigpo_sync"

__all__ = ["AGENT_LOOP_NAME", "ESTIMATOR_NAME", "STEP_CREDIT_ESTIMATORS", "TRAINER_MODE", "__version__"]
