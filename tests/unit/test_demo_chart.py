"""The demo chart's labels: moved apart so that no two overlap, however close their points."""

from __future__ import annotations

import itertools

import pytest
from boomerang_tools.demo.report import place_labels, spread


def test_spread_keeps_the_gap_and_the_order_and_moves_nothing_it_need_not() -> None:
    assert spread([0.0, 100.0, 200.0], 20.0) == [0.0, 100.0, 200.0]
    out = spread([50.0, 52.0, 51.0, 300.0], 20.0)
    assert out[3] == 300.0
    ordered = sorted(range(3), key=lambda i: [50.0, 52.0, 51.0][i])
    assert [out[i] for i in ordered] == sorted(out[:3])
    assert all(b - a >= 20.0 - 1e-9 for a, b in itertools.pairwise(sorted(out)))
    assert sum(out[:3]) / 3 == pytest.approx(51.0)  # a cluster spreads around its own middle
    # Spreading one cluster into the next merges them.
    merged = spread([0.0, 1.0, 30.0], 20.0)
    assert all(b - a >= 20.0 - 1e-9 for a, b in itertools.pairwise(sorted(merged)))


def test_labels_at_nearly_the_same_point_do_not_overlap() -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([0, 24], [0, 800])
    ax.set_xlim(0, 32)
    # Today's overlap: 3.69× and 3.13× a few milliseconds apart, with the ceiling just below.
    labels = [(24.0, 226.0, "3.69×", "C0"), (24.0, 229.0, "3.13×", "C1"), (24.0, 224.0, "3.71×", "C2"),
              (24.0, 215.0, "ceiling 3.90×", "C3")]
    place_labels(ax, labels)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]  # the text alone, not its leader line
    assert len(boxes) == 4
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
    plt.close(fig)
