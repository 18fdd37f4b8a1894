"""PNG plots of a benchmark (matplotlib, an optional extra: `pip install longswift[bench]`): speedup
and alpha over the generated length per method, and the time to generate N tokens (paper Fig. 1)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

from ..atomic import replace_atomically
from .metrics import curve_speedup


def _longest_cells(records: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """(prompt, prompt tokens, preset) -> first-run records of its longest generation length."""
    longest: dict[tuple, int] = {}
    for r in records:
        g = (r["prompt"], r["prompt_tokens"], r["preset"])
        longest[g] = max(longest.get(g, 0), r["length"])
    out: dict[tuple, list[dict[str, Any]]] = {}
    seen = set()
    for r in records:
        g = (r["prompt"], r["prompt_tokens"], r["preset"])
        if r["length"] == longest[g] and (g, r["method"], r["variant"]) not in seen:
            seen.add((g, r["method"], r["variant"]))
            out.setdefault(g, []).append(r)
    return out


def _label(r: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    several = sum(1 for x in runs if x["method"] == r["method"]) > 1
    return f"{r['method']} ({r['variant']})" if several else r["method"]


# Every plot plot_all may write: a directory's plots are those of its last report (stale_plots)
PLOT_NAMES = ("speedup_vs_length.png", "alpha_vs_length.png", "time_to_n_tokens.png")


def stale_plots(out_dir: Path, written: list[str]) -> None:
    """Remove the plots an earlier report of `out_dir` drew that this one did not (matplotlib gone, --no-plots,
    or records that no longer support one): they showed fewer records than the report beside them."""
    for name in PLOT_NAMES:
        if name not in written:
            (out_dir / name).unlink(missing_ok=True)


def plot_all(records: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Write the plots that the records support; return their file names (none without matplotlib)."""
    if not records or importlib.util.find_spec("matplotlib") is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _longest_cells(records)
    written = []
    for name, ylabel, series in zip(PLOT_NAMES, ("speedup vs our AR (x)", "alpha so far", "time since start (s)"),
                                    (_speedup_series, _alpha_series, _time_series)):
        panels = {g: series(runs) for g, runs in groups.items()}
        panels = {g: s for g, s in panels.items() if s}
        if not panels:
            continue
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax, ((prompt, tokens, preset), lines) in zip(axes.flat, panels.items()):
            for label, xs, ys in lines:
                ax.plot(xs, ys, marker="o", markersize=3, label=label)
            ax.set_title(f"{prompt}, {tokens}-token prompt, {preset}", fontsize=9)
            ax.set_xlabel("generated tokens")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.tight_layout()
        replace_atomically(out_dir / name, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
        plt.close(fig)
        written.append(name)
    return written


def _speedup_series(runs: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float]]]:
    ar = next((r for r in runs if r["method"] == "ar"), None)
    if ar is None:
        return []
    out = []
    for r in runs:
        if r is ar:
            continue
        curve = curve_speedup(ar["checkpoints"], r["checkpoints"], ar["prefill_seconds"], r["prefill_seconds"])
        if curve:
            out.append((_label(r, runs), [n for n, _ in curve], [s for _, s in curve]))
    return out


def _alpha_series(runs: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float]]]:
    return [(_label(r, runs), [n for n, _ in r["checkpoints"]], r["checkpoint_alpha"])
            for r in runs if r.get("checkpoint_alpha")]


def _time_series(runs: list[dict[str, Any]]) -> list[tuple[str, list[int], list[float]]]:
    return [(_label(r, runs), [1] + [n for n, _ in r["checkpoints"]], [r["prefill_seconds"]] + [t for _, t in r["checkpoints"]])
            for r in runs]
