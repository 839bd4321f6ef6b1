"""The commands ``python -m verl_gigpo.prompts from-reference CHECKOUT [--out DIR]`` (template files from your own
checkout of the reference implementation) and ``python -m verl_gigpo.prompts show --env ENV --step N [--template F]``
(the exact prompt of a sample state and its token count). Templates: docs/environments.md, "Prompt templates"; the
builder both engines use is :mod:`verl_gigpo.rollout.prompts`.
"""

from verl_gigpo.prompts.reference import (
    PROMPT_FILES,
    REFERENCE_LAYOUTS,
    REFERENCE_TEMPLATES,
    read_reference_template,
    write_templates,
)

__all__ = ["PROMPT_FILES", "REFERENCE_LAYOUTS", "REFERENCE_TEMPLATES", "read_reference_template", "write_templates"]
