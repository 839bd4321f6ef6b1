"""Card games played from images: EZPoints, NumberLine and Blackjack, with the rules of the reference's gym-cards tasks,
drawn by this project's own code (draw.py). ``observation="text"`` (default) plays them as text, for text models and
tests; ``"image"`` or ``"both"`` adds the drawing (docs/vision.md).

    from environments import make_env
    env = make_env("ezpoints", observation="image")
"""

from environments.cards.blackjack import BlackjackEnv, hand_total
from environments.cards.ezpoints import EZPointsEnv, evaluate_formula
from environments.cards.numberline import NumberLineEnv

__all__ = ["BlackjackEnv", "EZPointsEnv", "NumberLineEnv", "evaluate_formula", "hand_total"]
