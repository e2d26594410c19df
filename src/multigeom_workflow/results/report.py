"""
The tables of the run's Snakemake report (`snakemake --report report.html`): Stage 5's
metrics, the progress and seconds per image of every configuration, the run's settings.

Each table is written as a small HTML page (Snakemake's report shows HTML results in
place) and the metrics also as CSV. Everything is read from files a run leaves: Stage
5's metrics file, and the check's list of the per-image files
(``metrics/per_image_checked.tsv``), which records each file's ``elapsed_seconds``
(upstream's estimate of the image). Nothing is recomputed.

References
----------
Azeglio, Laquitaine, Ferrari & Chalk (2026). A multi-scale information geometry reveals
the structure of mutual information in neural populations. arXiv 2605.06304, Fig. 4D-E
(the alignment A_k and its chance level k/P).
"""

from __future__ import annotations

import html
import os
import statistics
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from ..atomic import atomic_path
from ..settings.names import N_PIXELS
from .figure import comparison_kind

__all__ = [
    "REPORT_KS",
    "metrics_table",
    "progress_table",
    "settings_table",
    "write_html_table",
]

#: The k at which the metrics table shows A_k (those up to the run's top_k).
REPORT_KS = (1, 5, 10, 20, 50)


def metrics_table(metrics: dict, n_pixels: int = N_PIXELS) -> pd.DataFrame:
    """
    Stage 5's metrics as a table: one row per pair of configurations and metric.

    Parameters
    ----------
    metrics : dict
        Stage 5's metrics file (``cross_encoder_metrics.json``; see
        `multigeom_workflow.results.alignment.align_configs`).
    n_pixels : int
        P, for the chance level k/P (64 x 64 = 4096).

    Returns
    -------
    pandas.DataFrame
        Columns ``metric`` (G or J), ``comparison`` (cross-model, cross-area or
        other), ``config_A``, ``config_B``, ``n_images``, then for every k of
        `REPORT_KS` up to the pair's largest k and that largest k: ``A_<k>`` (mean
        alignment), ``sem_<k>`` (its s.e.m. over images) and ``chance_<k>`` = k/P.
        Rows sorted by metric, comparison and pair.
    """
    rows = []
    for pair in metrics["pairs"].values():
        a, b = pair["config_A"], pair["config_B"]
        row = {
            "metric": pair["metric"],
            "comparison": comparison_kind(pair) or "other",
            "config_A": f"{a['encoder']}/{a['area']}",
            "config_B": f"{b['encoder']}/{b['area']}",
            "n_images": int(pair["n_images"]),
        }
        ks = [int(k) for k in pair["k"]]
        for k in sorted({k for k in REPORT_KS if k <= ks[-1]} | {ks[-1]}):
            i = ks.index(k)
            row[f"A_{k}"] = float(pair["alignment_mean"][i])
            row[f"sem_{k}"] = float(pair["alignment_sem"][i])
            row[f"chance_{k}"] = k / n_pixels
        rows.append(row)
    table = pd.DataFrame(rows)
    return table.sort_values(
        ["metric", "comparison", "config_A", "config_B"]
    ).reset_index(drop=True)


def progress_table(
    configurations: Iterable[tuple[str, str]],
    per_image_files: dict[tuple[str, str], list[str]],
    seconds: dict[str, float],
) -> pd.DataFrame:
    """
    Per configuration: images done, and seconds per image of the estimator.

    Parameters
    ----------
    configurations : iterable of (str, str)
        (encoder, area) of the run, in order.
    per_image_files : dict
        (encoder, area) -> the run's per-image files of that configuration.
    seconds : dict
        Per-image file -> its ``elapsed_seconds`` (seconds of upstream's estimate of
        the image, on the device that computed it;
        `multigeom_workflow.results.verify.checked_seconds`).

    Returns
    -------
    pandas.DataFrame
        Columns ``configuration``, ``images_done``, ``images``, ``timed`` (files that
        record their seconds), ``median_s``, ``mean_s``, ``min_s``, ``max_s``
        (seconds of the estimate of one image); NaN where no file records them.
    """
    rows = []
    for enc, area in configurations:
        files = per_image_files[(enc, area)]
        timed = [seconds[f] for f in files if f in seconds]
        rows.append(
            {
                "configuration": f"{enc}/{area}",
                "images_done": sum(os.path.exists(f) for f in files),
                "images": len(files),
                "timed": len(timed),
                "median_s": statistics.median(timed) if timed else float("nan"),
                "mean_s": statistics.fmean(timed) if timed else float("nan"),
                "min_s": min(timed) if timed else float("nan"),
                "max_s": max(timed) if timed else float("nan"),
            }
        )
    return pd.DataFrame(rows)


def settings_table(
    config: dict, files: dict[str, str | Path] | None = None
) -> pd.DataFrame:
    """
    The run's settings, one row per key (nested keys joined by dots), and the
    content of the settings files named in `files` (key -> path, e.g. the estimator's
    YAML) as ``<key> file: ...`` rows.
    """
    rows = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict) and value:
            for k in sorted(value):
                walk(f"{prefix}.{k}" if prefix else str(k), value[k])
        else:
            rows.append({"setting": prefix, "value": str(value)})

    walk("", config)
    for key, path in (files or {}).items():
        import yaml

        walk(f"{key} file", yaml.safe_load(Path(path).read_text()))
    return pd.DataFrame(rows)


def write_html_table(
    tables: list[tuple[str, pd.DataFrame]], out: str | Path, title: str
) -> None:
    """Write (heading, table) pairs as one self-contained HTML page, atomically."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;font-size:13px}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
        "text-align:right}th{background:#eee}</style></head><body>",
        f"<h2>{html.escape(title)}</h2>",
    ]
    for heading, table in tables:
        parts.append(f"<h3>{html.escape(heading)}</h3>")
        parts.append(
            table.to_html(index=False, float_format=lambda x: f"{x:.4g}", na_rep="")
        )
    parts.append("</body></html>")
    with atomic_path(out) as tmp:
        Path(tmp).write_text("\n".join(parts))
