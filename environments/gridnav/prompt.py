"""Prompt templates of the gridnav environment: deliberately tiny, so that CPU runs with a tiny model are fast.

Fields (see :meth:`environments.base.TextEnv.render_prompt`): ``{task}``, ``{history}``, ``{observation}``,
``{admissible_actions}``, ``{step}``, ``{max_steps}``. Only the history and the observation are shown: the task
never changes within a variant, and every constant token dilutes what a model trained from scratch attends to
(measured: a prompt ending in "Move (up, down, left, right)?" did not learn in 150 iterations where the bare
observation did). The step counter is left out too: the same state then gives the same prompt, which the local
engine forwards once per iteration.
"""

PROMPT_TEMPLATE = "{history}{observation}"

HISTORY_ITEM_TEMPLATE = "{observation} -> {action}\n"
