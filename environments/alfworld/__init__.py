"""ALFWorld (text) for GiGPO: the real alfworld/TextWorld engine behind the :class:`~environments.base.TextEnv`
contract, plus an offline generator of ALFRED-style games.

    python -m environments.alfworld.synth --out /tmp/alfworld --games-per-type 2     # offline games
    export ALFWORLD_DATA=/tmp/alfworld                                               # or the real data
    python -m environments.checker alfworld --seeds 2

Modules: :mod:`.env` (``AlfWorldEnv``), :mod:`.data` (data location, game lists), :mod:`.synth` (generator),
:mod:`.prompt` (prompt template). Nothing here imports alfworld or textworld until an environment is built or
games are generated.
"""

from environments.alfworld.env import AlfWorldEnv

__all__ = ["AlfWorldEnv"]
