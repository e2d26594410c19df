"""
The run's Snakemake report (`snakemake --report report.html`) and its tables
(`multigeom_workflow.results.report`): made from a finished run without recomputing
anything, it holds the figure, Stage 5's metrics as a table, progress and seconds per
image, and the settings.
"""

from __future__ import annotations

import base64
import json
import math
import re
import urllib.parse
from html.parser import HTMLParser

import pandas as pd
import pytest
import torch
from conftest import CONFIGURATIONS, run_snakemake

from multigeom_workflow.results.report import (
    metrics_table,
    progress_table,
    settings_table,
)


class _Tables(HTMLParser):
    """The cells of every <table> of an HTML page (no lxml needed)."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def read_tables(html: str) -> pd.DataFrame:
    """The page's tables (same header) as one frame; numbers as floats."""
    parser = _Tables()
    parser.feed(html)
    frames = [pd.DataFrame(t[1:], columns=t[0]) for t in parser.tables]
    table = pd.concat(frames, ignore_index=True)

    def numeric(col):
        try:
            return pd.to_numeric(col)
        except ValueError:
            return col

    return table.apply(numeric)


def report_results(html: str) -> dict:
    """The report's results (path -> entry with caption, mime type, data URI)."""
    match = re.search(r"var results = (\{.*?\});\n", html, re.S)
    assert match, "no results in the report"
    return json.loads(match.group(1))


def data_of(entry: dict) -> bytes:
    head, data = entry["data_uri"].split(",", 1)
    return (
        base64.b64decode(data)
        if head.endswith(";base64")
        else urllib.parse.unquote_to_bytes(data)
    )


@pytest.fixture(scope="module")
def demo_report(tiny_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "report.html"
    watched = [
        tiny_run / "results" / "fig4de.png",
        tiny_run / "results" / "eigenvectors.png",
        *tiny_run.glob("runs/per_image/*/*/*.pt"),
    ]
    before = {f: f.stat().st_mtime_ns for f in watched}
    result = run_snakemake(tiny_run, "--report", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    after = {f: f.stat().st_mtime_ns for f in watched}
    assert after == before  # nothing recomputed
    return out.read_text(), tiny_run


def test_report_holds_the_figure_with_its_caption(demo_report):
    html, run = demo_report
    results = report_results(html)
    figure = results["results/fig4de.png"]
    assert figure["mime_type"] == "image/png"
    assert data_of(figure) == (run / "results" / "fig4de.png").read_bytes()
    assert "chance k/P" in figure["caption"]
    assert "noise ceiling" in figure["caption"]
    assert "over the\n2 test images" in figure["caption"]  # n_images, from the config


def test_report_holds_the_eigenvector_pictures_with_their_caption(demo_report):
    html, run = demo_report
    figure = report_results(html)["results/eigenvectors.png"]
    assert figure["mime_type"] == "image/png"
    assert data_of(figure) == (run / "results" / "eigenvectors.png").read_bytes()
    caption = figure["caption"]
    # eigenvector_images (2) and noise_ceiling_images (1), from the config
    assert "(2 of them)" in caption and "for the first 1 of the run" in caption
    assert "G 2nd" in caption and "near-degenerate" in caption


def test_report_holds_the_metrics_table(demo_report):
    html, run = demo_report
    results = report_results(html)
    table_html = data_of(results["results/report/stage5_metrics.html"]).decode()
    table = read_tables(table_html)
    metrics = json.loads(
        (run / "runs" / "metrics" / "cross_encoder_metrics.json").read_text()
    )
    # 4 configurations: 6 pairs, for G and for J
    assert len(table) == 12 == len(metrics["pairs"])
    for pair in metrics["pairs"].values():
        a, b = pair["config_A"], pair["config_B"]
        row = table[
            (table.metric == pair["metric"])
            & (table.config_A == f"{a['encoder']}/{a['area']}")
            & (table.config_B == f"{b['encoder']}/{b['area']}")
        ]
        assert len(row) == 1
        # top_k = 5: A_1 and A_5, shown with 4 significant digits
        assert row["A_5"].iloc[0] == pytest.approx(pair["alignment_mean"][4], rel=1e-3)
        assert row["A_1"].iloc[0] == pytest.approx(pair["alignment_mean"][0], rel=1e-3)
        assert row["chance_5"].iloc[0] == pytest.approx(5 / 4096, rel=1e-3)
    progress = data_of(results["results/report/progress.html"]).decode()
    for enc, area in CONFIGURATIONS:
        assert f"<td>{enc}/{area}</td>" in progress
    settings = data_of(results["results/report/settings.html"]).decode()
    assert "<td>n_images</td>" in settings and "estimator file." in settings


def test_metrics_table_columns_and_chance():
    k = list(range(1, 13))
    pair = {
        "config_A": {"encoder": "e1", "area": "V1"},
        "config_B": {"encoder": "e2", "area": "V1"},
        "metric": "G",
        "n_images": 3,
        "k": k,
        "alignment_mean": [1 - 0.01 * i for i in k],
        "alignment_sem": [0.001 * i for i in k],
    }
    other = {**pair, "config_B": {"encoder": "e2", "area": "V4"}, "metric": "J"}
    table = metrics_table({"pairs": {"a": pair, "b": other}}, n_pixels=100)
    assert list(table.metric) == ["G", "J"]
    assert list(table.comparison) == ["cross-model", "other"]
    # k = 1, 5, 10 (those of REPORT_KS up to 12) and the largest, 12
    assert [c for c in table.columns if c.startswith("A_")] == [
        "A_1",
        "A_5",
        "A_10",
        "A_12",
    ]
    assert table.loc[0, "A_10"] == pytest.approx(0.90)
    assert table.loc[0, "sem_12"] == pytest.approx(0.012)
    assert table.loc[0, "chance_5"] == pytest.approx(0.05)


def test_progress_table_reads_the_seconds_the_check_recorded(tmp_path):
    """The seconds per image are the files' elapsed_seconds, as the check's list
    (verify_for_stage5's output) records them; a list of an older version (no
    seconds column) gives NaN, not an error."""
    from multigeom_workflow.results.verify import checked_seconds, read_checked

    files = []
    for i in range(3):
        f = tmp_path / "runs" / "per_image" / "e" / "a" / f"img{i:04d}.pt"
        f.parent.mkdir(parents=True, exist_ok=True)
        if i < 2:
            f.write_bytes(b"x")
        files.append(str(f))
    checked = tmp_path / "per_image_checked.tsv"
    checked.write_text(
        f"{files[0]}\t1\t2\t3\t2.0\n{files[1]}\t1\t2\t3\t6.0\n{files[2]}\t1\t2\t3\n"
    )
    seconds = checked_seconds(checked)
    assert seconds == {files[0]: 2.0, files[1]: 6.0}
    assert read_checked(checked)[files[0]] == "1\t2\t3"  # the key, seconds apart
    table = progress_table([("e", "a")], {("e", "a"): files}, seconds)
    row = table.iloc[0]
    assert (row.images_done, row.images, row.timed) == (2, 3, 2)
    assert (row.median_s, row.min_s, row.max_s) == (4.0, 2.0, 6.0)
    empty = progress_table([("e", "b")], {("e", "b"): []}, seconds)
    assert math.isnan(empty.iloc[0].median_s)


def test_a_refreshed_row_takes_the_file_s_seconds_and_the_list_keeps_its_form(
    tmp_path,
):
    """A file checked again at parse (changed behind the check's back, found good)
    gets its own elapsed_seconds in the list, not the old row's; every row has the
    columns the check's params name (CHECKED_LIST_COLUMNS)."""
    import os

    from multigeom_workflow.results.verify import (
        CHECKED_LIST_COLUMNS,
        checked_seconds,
        read_checked,
        refresh_checked,
    )

    f = tmp_path / "runs" / "per_image" / "e" / "a" / "img0000.pt"
    f.parent.mkdir(parents=True)
    torch.save({"elapsed_seconds": 3.5}, f)
    checked = tmp_path / "per_image_checked.tsv"
    checked.write_text(f"{f}\t1\t2\t3\t9.0\n")  # an old row: other key, seconds
    before = os.stat(checked).st_mtime_ns
    refresh_checked(checked, [f])
    assert checked_seconds(checked) == {str(f): 3.5}
    st = os.stat(f)
    assert read_checked(checked)[str(f)] == (
        f"{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}"
    )
    assert os.stat(checked).st_mtime_ns == before  # the list's date kept
    fields = checked.read_text().splitlines()[0].split("\t")
    assert len(fields) == len(CHECKED_LIST_COLUMNS.split()) == 5


def test_settings_table_flattens_nested_keys(tmp_path):
    est = tmp_path / "est.yaml"
    est.write_text("monte_carlo: {n_samples: 16}\n")
    table = settings_table({"n_images": 8, "demo": {"seed": 1}}, {"estimator": est})
    rows = dict(zip(table.setting, table.value, strict=True))
    assert rows == {
        "demo.seed": "1",
        "n_images": "8",
        "estimator file.monte_carlo.n_samples": "16",
    }
