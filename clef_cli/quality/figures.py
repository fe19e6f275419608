"""What every HTML report of clef's shares: the page style and the matplotlib figure helpers
(one figure per plot, the legend outside the data, inlined as a PNG data: URI)."""

from __future__ import annotations

import base64
import io
from typing import Any

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; } td, th { padding: 4px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; } .plots img { width: 340px; border: 1px solid #eee; }
.note { color: #666; font-size: 0.9em; }
"""


def new_figure() -> tuple[Any, Any]:
    """A figure with one axes and room below it for the legend (constrained layout)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(4.2, 4.2), dpi=90, layout="constrained")
    return figure, axes


def place_legend(figure: Any, axes: Any) -> None:
    """Below the axes, outside them: a legend never covers the data it explains."""
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=1, fontsize=8, frameon=False)


def png_uri(figure: Any) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
