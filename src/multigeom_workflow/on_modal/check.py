"""
``multigeom-workflow modal-check``: a first contact with a real Modal account that
costs cents, to run before the first ``snakemake --profile modal``.

It runs what a real run runs, through the executor plugin's own code: the container
image of the Modal profile (the same pins, local packages and build commands), built
with its output shown; the run's app with the GPU of the config's ``modal.gpu`` (its
fallback list too); the plugin's staging of files to the volume; and the plugin's
container entry (``run_job``), which starts a one-job Snakemake workflow as a
subprocess from a scratch folder, as it starts a shard. That job runs ``nvidia-smi``,
imports ``multigeom_workflow`` and torch (the package the per-image jobs import, found
through the ``PYTHONPATH`` the plugin gives the job), asks torch for the GPU, and
answers a file sent through the volume; its log and its output come back as a run's
do. The container cannot cost more than a hard cap: its start-up is limited to the
plugin's start-up seconds (declared to Modal as ``startup_timeout``) and its timeout
is what the cap buys beyond them at the GPU's price (``check_timeout``). Printed:
the image build and the cold-start times, the GPU job's time and cost, and what
failed.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ..settings.files import CHECKOUT_DIR
from ..settings.load import load_config

__all__ = [
    "CHECK_SNAKEFILE",
    "DEADLINE_MARGIN_S",
    "add_parser",
    "check_gpu",
    "check_timeout",
    "main",
    "wait_for_call",
]

#: Seconds granted beyond the call's timeout and start-up before the check gives up
#: on a call whose end Modal has not reported, and cancels it.
DEADLINE_MARGIN_S = 60

#: The one-job workflow the check's container runs (as it runs a shard's jobs).
CHECK_SNAKEFILE = """\
rule probe:
    input: "question.txt"
    output: "answer.txt"
    shell:
        "(nvidia-smi || echo 'nvidia-smi: not found or no GPU'); "
        "python -c 'import multigeom_workflow, torch; "
        "print(\\"multigeom_workflow from\\", multigeom_workflow.__file__); "
        "print(\\"torch\\", torch.__version__, "
        "\\"cuda\\", torch.cuda.is_available())'; "
        "echo answer to $(cat {input}) > {output}"
"""
#: The check's job log, relative to its working directory.
CHECK_LOG = ".snakemake/modal/modal-check.log"
#: Shortest container time a cost cap must buy, seconds.
MIN_SECONDS = 60
#: Cores the check's container asks (``cpu=``); its memory is Modal's default.
CHECK_CPU = 1.0


def here_name() -> Path:
    """The workflow's own config file, relative to a checkout."""
    return Path("config", "config.yaml")


def check_gpu(spec: str):
    """
    The plugin's GPU request for ``modal.gpu`` (a type, a count, or a fallback list)
    and the price that bounds the check's container, USD per second: its dearest
    type's, with the `CHECK_CPU` cores and Modal's default memory it also bills
    (the plugin's ``prices.ContainerRequest``).

    Raises
    ------
    ValueError
        If the specification is malformed or a type has no price (the plugin's
        ``preflight.gpu_problem``).
    """
    from snakemake_executor_plugin_modal.preflight import gpu_problem
    from snakemake_executor_plugin_modal.prices import ContainerRequest, parse_gpu

    problem = gpu_problem(spec, "config key 'modal.gpu'")
    if problem:
        raise ValueError(problem)
    request = parse_gpu(spec)
    return request, ContainerRequest(request, cpu=CHECK_CPU).usd_per_second


def check_timeout(max_cost_usd: float, usd_per_s: float, startup_s: float) -> int:
    """
    The check's container timeout, seconds: the most that keeps its worst case, the
    container's price (GPU, cores, memory) x (timeout + start-up), within the cap. Modal
    bills a container from its start, its start-up included, and the function is
    declared with both a ``startup_timeout`` ("Maximum startup time in seconds with
    higher precedence than `timeout`", ``App.function``'s docstring, ``modal/app.py``,
    modal 1.6.4) and a ``timeout``, so the bill is at most price x (startup_timeout +
    timeout): the plugin's ledger counts the same worst case (``Ledger.worst_case``).

    Parameters
    ----------
    max_cost_usd : float
        The hard cap, USD (``--max-cost-usd``).
    usd_per_s : float
        The container's price (`check_gpu`: the dearest GPU type of a fallback
        list, its cores and memory), USD per second.
    startup_s : float
        The start-up declared to Modal (the plugin's ``STARTUP_S``), seconds.

    Returns
    -------
    int
        Seconds; below ``MIN_SECONDS`` (negative too) when the cap buys too little.
    """
    return math.floor(max_cost_usd / usd_per_s - startup_s)


def add_parser(sub) -> None:
    """Register ``modal-check`` on the CLI's subparsers."""
    p = sub.add_parser(
        "modal-check",
        help="run one tiny job on Modal as a real run does (cents)",
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
    p.add_argument(
        "--configfile",
        nargs="+",
        default=[],
        help="config files whose modal.gpu is checked (as Snakemake merges them)",
    )
    p.add_argument("--volume", help="Modal Volume (default: the profile's)")
    p.add_argument(
        "--max-cost-usd",
        type=float,
        default=0.25,
        help="hard cap: the container's start-up and timeout are what this buys of "
        "the GPU, so it cannot cost more (default 0.25)",
    )


def main(args) -> int:
    """
    Run the check; 0 if everything worked, 1 if something failed (each failure
    printed), 2 if it could not start (a refusal, one line: a malformed GPU, a cap
    too low, no credentials, a token Modal refuses, Modal out of reach).
    """
    import yaml

    profile = yaml.safe_load((args.profile / "profile.yaml").read_text())
    volume_name = args.volume or profile.get("modal-volume", "snakemake")
    here = here_name().exists()  # in a working directory of runs
    files = args.configfile or ([] if here else [str(CHECKOUT_DIR / here_name())])
    config = load_config(files, [], CHECKOUT_DIR)
    spec = str(config.get("modal", {}).get("gpu", "A100-80GB"))
    try:
        gpu, usd_per_s = check_gpu(spec)
    except ValueError as e:
        print(f"modal-check: {e}", file=sys.stderr)
        return 2
    from snakemake_executor_plugin_modal import preflight
    from snakemake_executor_plugin_modal.calls import STARTUP_S

    timeout_s = check_timeout(args.max_cost_usd, usd_per_s, STARTUP_S)
    if timeout_s < MIN_SECONDS:
        least = (MIN_SECONDS + STARTUP_S) * usd_per_s
        print(
            f"modal-check: --max-cost-usd {args.max_cost_usd:g} buys "
            f"{max(timeout_s, 0)} s of {spec} beyond its {STARTUP_S} s of start-up; "
            f"allow at least {least:.3f} USD",
            file=sys.stderr,
        )
        return 2
    from snakemake_executor_plugin_modal.image import check_python_version

    problem = preflight.credentials_problem()
    if problem:
        print(f"modal-check: {problem}", file=sys.stderr)
        return 2
    check_python_version(sys.version_info)
    local = list(profile.get("modal-local-packages") or [])
    if "multigeom_workflow" not in local:
        local.append("multigeom_workflow")
    with tempfile.TemporaryDirectory() as work:
        return _run(
            Path(work), profile, local, volume_name, gpu, usd_per_s, timeout_s, args
        )


def _run(work, profile, local, volume_name, gpu, usd_per_s, timeout_s, args) -> int:
    """The check itself, with ``work`` as the check's working directory."""
    import modal
    from snakemake_executor_plugin_modal.calls import (
        MOUNT,
        STARTUP_S,
        ContainerCall,
        RunApp,
        start_error,
    )
    from snakemake_executor_plugin_modal.image import container_image
    from snakemake_executor_plugin_modal.prices import ContainerRequest
    from snakemake_executor_plugin_modal.staging import VolumeStager
    from snakemake_interface_common.exceptions import WorkflowError

    token = uuid.uuid4().hex[:12]
    (work / "Snakefile").write_text(CHECK_SNAKEFILE)
    (work / "question.txt").write_text(token)
    image = container_image(
        profile.get("modal-pip") or [], local, profile.get("modal-image-commands") or []
    )
    prefix = f".modal-check/{token}"
    try:  # the first request to Modal: a refused token or no network, in one line
        volume = modal.Volume.from_name(volume_name, create_if_missing=True)
        stager = VolumeStager(volume, prefix, work)
        stager.upload(["Snakefile", "question.txt"])
    except Exception as e:
        err = start_error(e, doing=f"upload to the volume {volume_name!r}")
        print(f"modal-check: {err}", file=sys.stderr)
        return 2
    print(
        f"modal-check: building the image (or finding it built); then one job on "
        f"{','.join(gpu.types)}, stopped after {STARTUP_S} s of start-up and "
        f"{timeout_s} s of timeout at most (cap {args.max_cost_usd:g} USD)",
        flush=True,
    )
    failures = []
    t0 = time.monotonic()
    try:
        app = RunApp(
            "multigeom-modal-check",
            image,
            volume,
            timeout_s,
            gpu,
            startup_timeout_s=STARTUP_S,
        )
    except WorkflowError as e:
        print(f"modal-check: {e}", file=sys.stderr)
        _remove(volume, prefix)
        return 1
    built = time.monotonic() - t0
    spec = {
        "mount": MOUNT,
        "volume": volume_name,
        "prefix": prefix,
        "stage": ["Snakefile", "question.txt"],
        "command": "python -m snakemake --cores 1 --nolock answer.txt",
        "outputs": [["answer.txt", "answer.txt"]],
        "results": [],
        "log": CHECK_LOG,
        "sync_every_s": 30,
        "python_packages": ["snakemake_executor_plugin_modal", *local],
        "members": [],
    }
    spawned_at = time.time()
    try:
        call = ContainerCall(
            app.spawn(spec, gpu, CHECK_CPU, None, timeout_s),
            gpu,
            timeout_s,
            request=ContainerRequest(gpu, cpu=CHECK_CPU),
        )
        deadline_s = timeout_s + STARTUP_S + DEADLINE_MARGIN_S
        outcome = wait_for_call(call, deadline_s)
        app_id = app.app_id
    finally:
        app.stop()
    if outcome is None:
        failures.append(
            f"Modal had not reported the end of the GPU job {deadline_s} s after it "
            f"was spawned (its timeout {timeout_s} s, start-up {STARTUP_S} s and "
            f"{DEADLINE_MARGIN_S} s more): cancelled; Modal's dashboard shows app "
            f"{app_id}"
        )
    print(f"image build (or cache lookup) and app start: {built:.1f} s")
    print(
        f"GPU job on {','.join(gpu.types)}: {call.seconds:.1f} s wall-clock, about "
        f"{call.cost_usd:.4f} USD (at most "
        f"{(timeout_s + STARTUP_S) * usd_per_s:.2f})"
    )
    if outcome is not None and outcome.result is not None:
        print(f"cold start: {outcome.result['started'] - spawned_at:.1f} s")
    if outcome is not None and not outcome.ok:
        failures.append(f"the GPU job failed: {outcome.message}")
    stager.download(["answer.txt", CHECK_LOG], missing_ok=True)
    log = work / CHECK_LOG
    text = log.read_text(errors="replace") if log.exists() else ""
    for line in text.splitlines():
        if "NVIDIA-SMI" in line or "multigeom_workflow from" in line or "cuda" in line:
            print(f"  job log: {line.strip()}")
    if "NVIDIA-SMI" not in text:
        failures.append("nvidia-smi found no GPU in the container (see its log)")
    if "multigeom_workflow from" not in text:
        failures.append("the job's Python could not import multigeom_workflow")
    if "cuda True" not in text:
        failures.append("torch sees no GPU in the container")
    answer = work / "answer.txt"
    if answer.exists() and answer.read_text().strip() == f"answer to {token}":
        print("volume round trip: ok")
    else:
        failures.append("the file sent through the volume did not come back answered")
    _remove(volume, prefix)
    for f in failures:
        print(f"modal-check: {f}", file=sys.stderr)
    if failures and text:
        tail = "\n".join(text.splitlines()[-30:])
        print(f"modal-check: last lines of the job's log:\n{tail}", file=sys.stderr)
    return 1 if failures else 0


def wait_for_call(call, deadline_s: float, sleep=time.sleep, clock=time.monotonic):
    """
    Poll `call` (the plugin's ``ContainerCall``) once a second until it ends, for at
    most `deadline_s` seconds; a call still not ended then is cancelled
    (``ContainerCall.cancel``, which also counts its seconds up to then).

    Returns
    -------
    Outcome or None
        The call's outcome, or None when it was given up at the deadline.
    """
    end = clock() + deadline_s
    while True:
        outcome = call.poll()
        if outcome is not None:
            return outcome
        if clock() >= end:
            call.cancel()
            return None
        sleep(1)


def _remove(volume, prefix: str) -> None:
    """Delete the check's folder on the volume (an error doing so is ignored)."""
    try:
        volume.remove_file(prefix, recursive=True)
    except Exception:
        pass
