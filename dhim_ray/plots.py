"""Curves as PNG files: precision@k (or known-item recall@k) against k for every method of an
evaluation (``dhim-ray eval --plot``), and a training run's selection score and loss per epoch
(``training.png`` beside a checkpoint, ``dhim-ray curve``). matplotlib comes with the base install.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dhim_ray.errors import ConfigError

INSTALL = "pip install matplotlib (part of dhim-ray's install; this environment lacks it)"
#: The k a curve is drawn at: 1 to 1,000, evenly on a log scale (those the database has).
CURVE_KS = (1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1000)


#: A run's selection criterion -> (its per-epoch figure, what to call it).
SCORES = {"labels": ("val_precision", "val precision@k (tie-aware)"),
          "neighbours": ("val_neighbour_recall", "val cosine-neighbour recall")}


def plotting_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def check_plot_path(path: str | Path) -> Path:
    """A path a curve can be written to (not a folder; the CLI's parser has checked the .png
    name), and matplotlib there to draw it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"--plot {path}: is a folder; give a file name ending in .png")
    if not plotting_available():
        raise ConfigError(f"--plot needs matplotlib, which is not installed: {INSTALL}")
    return path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _label(result: dict[str, Any]) -> str:
    width = f"{result['n_bits']} bits" if "n_bits" in result else f"{result.get('dims', '?')} floats"
    return f"{result['method']} ({width})"


def k_curves(results: Sequence[dict[str, Any]], path: str | Path, what: str, title: str) -> Path:
    """One line per result (its ``curve``: {"k": [...], "value": [...]}) against k on a log axis."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for result in results:
        curve = result["curve"]
        ax.plot(curve["k"], curve["value"], marker="o", markersize=3, label=_label(result))
    ax.set_xscale("log")
    ax.set_xlabel("k")
    ax.set_ylabel(what)
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, plt, path)


def training_curve(summary: dict[str, Any], path: str | Path) -> Path | None:
    """The selection score and the training loss per epoch, the chosen epoch marked; None
    where the run has no epochs to draw."""
    history = summary.get("history") or []
    if not history:
        return None
    plt = _pyplot()
    epochs = [h["epoch"] + 1 for h in history]  # counted from 1, as the summary's stopped line counts them
    fig, loss_ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    loss_ax.plot(epochs, [h["loss"] for h in history], color="tab:gray", marker=".", label="training loss")
    loss_ax.set_xlabel("epoch")
    loss_ax.set_ylabel("training loss")
    loss_ax.xaxis.get_major_locator().set_params(integer=True)
    score_ax = loss_ax.twinx()
    key, name = SCORES.get(summary.get("criterion"), (None, None))
    if key is not None:
        name = summary.get("selected_by") or name  # with the run's k: "val P@100 (tie-aware)"
        score_ax.plot(epochs, [h.get(key) for h in history], color="tab:blue", marker="o", markersize=3, label=name)
        score_ax.set_ylabel(name)
        score_ax.set_ylim(0, 1)  # a score's axis starts at zero: a rise of 0.01 looks like one
    best = summary.get("best_epoch")
    if best:  # counted from 1
        score_ax.axvline(best, color="tab:green", linestyle="--", label=f"chosen: epoch {best}")
    lines = loss_ax.get_legend_handles_labels(), score_ax.get_legend_handles_labels()
    fig.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], fontsize=8, loc="lower center", ncol=3,
               frameon=False)  # under the axes: inside, it covered one of the two curves
    corpus = Path(str(summary.get("corpus", ""))).name
    loss_ax.set_title(f"training on {corpus}: the epoch picked by {summary.get('selected_by', 'the last epoch')}",
                      fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(fig, plt, path)


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    try:
        fig.savefig(partial, format="png")
        partial.replace(path)
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
    return path
