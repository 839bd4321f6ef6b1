"""Sokoban: the project's own room generator, a shortest-plan solver and the text environment.

from environments.sokoban import SokobanEnv, generate_room, solve
"""

from environments.sokoban.env import SokobanEnv
from environments.sokoban.generator import GeneratedRoom, check_room_config, generate_room
from environments.sokoban.room import ACTIONS, LEGEND, MoveOutcome, Room, apply_move, parse_room, render_room
from environments.sokoban.solver import SolverLimitError, solve

__all__ = [
    "ACTIONS",
    "LEGEND",
    "GeneratedRoom",
    "MoveOutcome",
    "Room",
    "SokobanEnv",
    "SolverLimitError",
    "apply_move",
    "check_room_config",
    "generate_room",
    "parse_room",
    "render_room",
    "solve",
]
