"""The evaluation's figure (``success_by_type.png``), CPU only: its title and subtitle stay inside the figure."""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg

from verl_gigpo.evaluate.report import success_figure, success_rows
from verl_gigpo.rollout.transcripts import EpisodeOutcome


def test_a_long_subtitle_is_wrapped_inside_a_one_bar_figure():
    """One task type (gridnav): the narrowest figure; the decoding line used to run off both edges."""
    outcomes = [
        EpisodeOutcome(f"t{i}", "e0", i, f"t{i}", "goal", i % 3 == 0, 5, 1.0, 0, False) for i in range(16)
    ]  # (group, traj, seed, task id, task type, won, length, return, invalid replies, env error)
    subtitle = "sampled (temperature 1.0), restricted to the action words; 1 episode(s) per task, seed 1"
    fig = success_figure(success_rows(outcomes), title=f"gridnav test\n{subtitle}")
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    title = fig.axes[0].title
    box, page = title.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)
    assert " ".join(title.get_text().split()) == f"gridnav test {subtitle}"  # every word kept
    assert title.get_text().count("\n") >= 2
