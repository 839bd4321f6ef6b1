"""Grid navigation: the small text task the tiny-model demo and the learning benchmark train on."""

from environments.gridnav.env import ACTIONS, GridNavEnv, GridTask, generate_task, shortest_path

__all__ = ["ACTIONS", "GridNavEnv", "GridTask", "generate_task", "shortest_path"]
