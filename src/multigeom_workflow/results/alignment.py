"""
Stage 5: subspace alignment and Bures-Wasserstein distance between configurations, by
upstream's own command, `multigeom.pipeline.alignment` (Azeglio et al. 2026, Fig. 4D-E).

Upstream's command reads every per-image file under a runs folder. To restrict it to a
run's configurations and first `n_images` images, it is run on a view: a temporary
folder of links to exactly those files, in upstream's layout. The metrics are then
those upstream computes, by construction: for every pair of configurations A, B, every
shared image and k = 1..top_k, the alignment A_k = (1/k) ||V_A^T V_B||_F^2 of the top-k
eigenvectors (of G(x) and of J(x)), with its mean and s.e.m. over images.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ..atomic import atomic_path
from ..settings.layout import RunLayout, parse_image_file

__all__ = ["align_configs"]


def align_configs(
    per_image_files: Iterable[str | Path],
    out: str | Path,
    max_k: int,
    n_images: int | None = None,
) -> dict:
    """
    Run upstream's Stage 5 on exactly `per_image_files` and write its metrics file.

    Parameters
    ----------
    per_image_files : iterable of path
        Files ``.../per_image/<encoder>/<area>/img{i:04d}.pt``; the two folders above
        each file name its configuration.
    out : str or Path
        The metrics file (``cross_encoder_metrics.json``), written atomically.
    max_k : int
        Largest k of the curves.
    n_images : int, optional
        The images every pair must average over: upstream leaves out an image whose
        eigenvectors are missing, and such metrics are refused, not written.

    Returns
    -------
    dict
        The metrics, as upstream writes them: ``pairs`` (label -> n_images, k,
        alignment_mean, alignment_sem, bures_wasserstein_mean, bures_wasserstein_sem,
        metric, config_A, config_B), ``named`` (the paper's comparisons) and
        ``provenance``.

    Raises
    ------
    ValueError
        If the files belong to fewer than two configurations (nothing to compare), or
        a pair averages over fewer than `n_images` images (nothing is written then).
    """
    from multigeom.pipeline import alignment

    files = {Path(f).resolve(): parse_image_file(f) for f in per_image_files}
    configs = {(key.encoder, key.area) for key in files.values()}
    if len(configs) < 2:
        raise ValueError(
            f"Stage 5 compares configurations, and the run has {len(configs)} "
            f"({sorted(configs)}): list at least two in the config key 'configs'"
        )
    with tempfile.TemporaryDirectory(prefix="stage5-") as view:
        layout = RunLayout(view)
        for f, key in files.items():
            link = Path(layout.per_image_file(*key))
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(f, link)
        alignment.main(
            ["--runs-dir", view, "--out-dir", f"{view}/metrics", "--max-k", str(max_k)]
        )
        written = Path(view, "metrics", "cross_encoder_metrics.json")
        pairs = json.loads(written.read_text())["pairs"]
        short = [
            (label, p["n_images"])
            for label, p in pairs.items()
            if n_images is not None and p["n_images"] != n_images
        ]
        if short:
            raise ValueError(
                f"Stage 5: pair {short[0][0]} averages over {short[0][1]} images, "
                f"not n_images = {n_images} (a per-image file lacks eigenvectors); "
                "run `multigeom-workflow verify` to find it"
            )
        with atomic_path(out) as tmp:
            shutil.copyfile(written, tmp)
    return json.loads(Path(out).read_text())
