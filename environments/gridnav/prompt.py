"""Prompt templates of the gridnav environment: deliberately tiny, so that CPU runs with a tiny model are fast.

Fields (see :meth:`environments.base.TextEnv.render_prompt`): ``{task}``, ``{history}``, ``{observation}``,
``{admissible_actions}``, ``{step}``, ``{max_steps}``. The step counter is left out on purpose: the same state
then gives the same prompt, which the local engine forwards once per iteration.
"""

PROMPT_TEMPLATE = "{task}\n{history}Now: {observation}\nMove ({admissible_actions})?"

HISTORY_ITEM_TEMPLATE = "{observation} -> {action}\n"
