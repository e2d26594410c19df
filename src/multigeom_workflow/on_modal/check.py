"""
``multigeom-workflow modal-check``: a first contact with a real Modal account that
costs a few cents, to run before the first ``snakemake --profile modal``.

It builds the container image of the Modal profile (the same pins, local packages and
build commands as a run), runs one tiny job on the cheapest GPU with a hard time limit
derived from a cost cap, checks that torch sees the GPU and that a file makes the
round trip through the volume, and prints what it cost and how long the image build
and the cold start took.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import uuid
from pathlib import Path, PurePosixPath

from ..settings.files import CHECKOUT_DIR

__all__ = ["add_parser", "cheapest_gpu", "main", "probe"]

#: Where the check's container mounts the volume.
MOUNT = "/modal-check"


def cheapest_gpu() -> tuple[str, float]:
    """The cheapest GPU type of the plugin's price table and its USD per second."""
    from snakemake_executor_plugin_modal.prices import PRICES_USD_PER_S

    gpu = min(PRICES_USD_PER_S, key=PRICES_USD_PER_S.get)
    return gpu, PRICES_USD_PER_S[gpu]


def probe(mount: str, volume_name: str, question: str, answer: str) -> dict:
    """
    Runs in the container: torch's view of the GPU, and the volume round trip (read
    the file the client sent, write the answer and commit it).

    Returns
    -------
    dict
        ``started`` (epoch seconds), ``cuda`` (bool), ``device`` (str), ``torch``
        (version), ``read`` (the question file's text, or None).
    """
    started = time.time()
    import modal
    import torch

    question_path = Path(mount, question)
    read = question_path.read_text() if question_path.exists() else None
    Path(mount, answer).write_text(f"answer to {read}")
    modal.Volume.from_name(volume_name).commit()
    cuda = torch.cuda.is_available()
    return {
        "started": started,
        "cuda": cuda,
        "device": torch.cuda.get_device_name(0) if cuda else "none",
        "torch": torch.__version__,
        "read": read,
    }


def add_parser(sub) -> None:
    """Register ``modal-check`` on the CLI's subparsers."""
    p = sub.add_parser(
        "modal-check",
        help="build the Modal image and run one tiny GPU job (a few cents)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=CHECKOUT_DIR / "profiles" / "modal",
        help="the Modal profile folder whose image is checked (default: this "
        "checkout's profiles/modal)",
    )
    p.add_argument("--volume", help="Modal Volume (default: the profile's)")
    p.add_argument(
        "--max-cost-usd",
        type=float,
        default=0.05,
        help="hard cap: the container is stopped once its GPU time would cost "
        "this much (default 0.05)",
    )


def main(args) -> int:
    """Run the check; 0 if everything worked, 1 otherwise (what failed is printed)."""
    import modal
    import modal.exception
    import yaml
    from snakemake_executor_plugin_modal.image import (
        check_python_version,
        container_image,
    )

    profile = yaml.safe_load((args.profile / "profile.yaml").read_text())
    volume_name = args.volume or profile.get("modal-volume", "snakemake")
    gpu, usd_per_s = cheapest_gpu()
    timeout_s = math.floor(args.max_cost_usd / usd_per_s)
    if timeout_s < 60:
        print(
            f"modal-check: --max-cost-usd {args.max_cost_usd:g} buys {timeout_s} s of "
            f"{gpu}; allow at least {60 * usd_per_s:.3f} USD",
            file=sys.stderr,
        )
        return 2
    check_python_version(sys.version_info)
    local = list(profile.get("modal-local-packages") or [])
    image = container_image(
        profile.get("modal-pip") or [],
        local + ([] if "multigeom_workflow" in local else ["multigeom_workflow"]),
        profile.get("modal-image-commands") or [],
    )
    volume = modal.Volume.from_name(volume_name, create_if_missing=True)
    token = uuid.uuid4().hex[:12]
    folder = PurePosixPath(".modal-check", token)
    question, answer = str(folder / "question.txt"), str(folder / "answer.txt")
    with _tempfile(token) as local, volume.batch_upload(force=True) as batch:
        batch.put_file(str(local), "/" + question)
    app = modal.App("multigeom-modal-check")
    function = app.function(
        image=image,
        gpu=gpu,
        timeout=timeout_s,
        volumes={MOUNT: volume},
        serialized=True,
        single_use_containers=True,
    )(probe)
    print(f"modal-check: building the image (cap {args.max_cost_usd:g} USD on {gpu})")
    t0 = time.monotonic()
    failures = []
    with modal.enable_output():
        run = app.run()
        try:
            run.__enter__()
        except modal.exception.Error as e:
            print(f"modal-check: the image build failed: {e}", file=sys.stderr)
            return 1
    try:
        built = time.monotonic() - t0
        spawned_at, t1 = time.time(), time.monotonic()
        try:
            result = function.spawn(MOUNT, volume_name, question, answer).get()
        except Exception as e:
            result = None
            failures.append(f"the GPU job failed: {type(e).__name__}: {e}")
        seconds = time.monotonic() - t1
    finally:
        run.__exit__(None, None, None)
    cost = seconds * usd_per_s
    print(f"image build (or cache lookup): {built:.1f} s")
    print(f"GPU job on {gpu}: {seconds:.1f} s wall-clock, about {cost:.4f} USD")
    if result is not None:
        print(f"cold start: {result['started'] - spawned_at:.1f} s")
        print(f"torch {result['torch']}: GPU {result['device']}")
        if not result["cuda"]:
            failures.append("torch sees no GPU in the container")
        if result["read"] != token:
            failures.append("the file sent to the volume was not read back")
    try:
        data = b"".join(volume.read_file(answer)).decode()
        if data != f"answer to {token}":
            failures.append(f"the container's file came back wrong: {data!r}")
        else:
            print("volume round trip: ok")
    except Exception as e:
        failures.append(f"the container's file did not come back: {e}")
    for path in (question, answer):
        try:
            volume.remove_file(path)
        except Exception:
            pass
    for f in failures:
        print(f"modal-check: {f}", file=sys.stderr)
    return 1 if failures else 0


class _tempfile:
    """A temporary local file holding ``text`` (context manager giving its path)."""

    def __init__(self, text: str):
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.path = Path(self._dir.name, "f.txt")
        self.path.write_text(text)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        self._dir.cleanup()
