"""
The workflow on Modal, through the repository's executor plugin and the installed
``modal`` client against the local Modal server of the plugin's tests (in this process:
containers are local processes of Modal's container entrypoint, a volume a folder;
`local_modal`): `snakemake --profile profiles/modal` on the reduced demo (2 images per
configuration), ``multigeom-workflow modal-check`` and ``progress`` on a volume.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import torch
from conftest import (
    CONFIGURATIONS,
    REPO,
    TINY_CONFIG,
    local_modal,
    modal_cli,
    modal_tests,
)
from snakemake_executor_plugin_modal.staging import default_prefix

# Made at run time, so that it is not in the sources the plugin uploads: the token
# secret the local server accepts, and the client is given.
SECRET = "modal-secret-" + uuid.uuid4().hex
TENSORS = ("G_eigenvalues", "G_eigenvectors", "J_eigenvalues", "J_eigenvectors")
#: What the local Modal server was asked to run (``tests/helpers.py`` of the plugin).
spawned = modal_tests("helpers").spawned


def functions_of(server, calls: list[dict]) -> list:
    """The function (``with_options`` variant) each of `calls` was made on: the
    server's ``FunctionRecord``, whose ``definition`` carries what it runs with."""
    with server.state.lock:
        return [
            server.state.functions[
                server.state.function_calls[c["call_id"]].function_id
            ]
            for c in calls
        ]


def workflow_copy(dest: Path) -> Path:
    """The repository's tracked files in `dest`, as a git repository (the plugin
    stages what Snakemake lists as the workflow's sources, git's files among them)."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for f in files:
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    return dest


@pytest.fixture(scope="module")
def modal_run(tiny_run, tmp_path_factory):
    """The reduced demo's per-image jobs run on the local Modal server (assets built
    locally by the reduced demo beforehand, as a researcher's earlier local run
    would); the server runs, and this process's environment points at it, until the
    module's tests end."""
    root = tmp_path_factory.mktemp("modal")
    work = workflow_copy(root / "wf")
    shutil.copytree(tiny_run / "runs", work / "runs", symlinks=True)
    shutil.rmtree(work / "runs" / "per_image")
    shutil.rmtree(work / "runs" / "metrics", ignore_errors=True)
    config = work / "tests" / "data" / TINY_CONFIG.name
    # the config's modal section is the one home of the GPU and the budget
    modal_config = work / "tests" / "data" / "modal-l4.yaml"
    modal_config.write_text("modal:\n  gpu: L4\n  max_cost_usd: 5\n")
    subprocess.run(["git", "add", "-A"], cwd=work, check=True)
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/modal"]
    cmd += ["--configfile", str(config), str(modal_config), "--cores", "2"]
    cmd += ["--jobs", "3", "--modal-volume", "wf-test"]
    cmd += ["--envvars", "MODAL_TOKEN_SECRET"]
    # finished files stay on the volume once home (by default they leave it: the
    # plugin's tests/test_volume_size.py), as a researcher who reads progress on the
    # volume from another machine keeps them; the rerun below reuses them
    cmd += ["--modal-keep-on-volume"]
    with local_modal(root, token_secret=SECRET) as server:
        assert os.environ["MODAL_TOKEN_SECRET"] == SECRET
        dry = subprocess.run([*cmd, "-n"], cwd=work, capture_output=True, text=True)
        result = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        yield work, server, result, dry


def test_modal_profile_runs_the_demo(modal_run, tiny_run):
    work, _, result, _ = modal_run
    assert result.returncode == 0, result.stderr[-5000:]
    assert (work / "results" / "fig4de.png").exists()
    for enc, area in CONFIGURATIONS:
        for i in range(2):
            rel = Path("runs", "per_image", enc, area, f"img{i:04d}.pt")
            modal = torch.load(work / rel, weights_only=False)
            local = torch.load(tiny_run / rel, weights_only=False)
            for key in TENSORS:  # same seed per image: the same numbers as locally
                assert torch.equal(modal[key], local[key]), (rel, key)


def test_one_container_per_shard_with_the_configs_gpu(modal_run):
    _, server, result, dry = modal_run
    assert result.returncode == 0, result.stderr[-5000:]
    calls = spawned(server)
    # 8 per-image jobs in 3 shards (3, 3, 2 images); every other rule ran locally
    assert len(calls) == 3
    assert {c["status"] for c in calls} == {"GENERIC_STATUS_SUCCESS"}
    assert sorted(len(c["task_ids"]) for c in calls) == [1, 1, 1]
    assert len(server.state.containers) == 3
    # the config's modal.gpu: what the dry run priced, what the containers got
    assert [c["gpus"] for c in calls] == [["L4:1"]] * 3
    assert {b["gpu"] for b in server.state.bill()} == {"L4:1"}
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "on Modal (L4, 0.000222 USD/s)" in dry.stderr
    assert "(limit modal.max_cost_usd = 5.00 USD)" in dry.stderr
    per_image = [
        job.split("rule ")[0] for job in dry.stdout.split("rule estimate_image:")
    ]
    assert len(per_image[1:]) == 8
    # a dry run knows the run is for Modal (Snakemake 9.27 on keeps the executor
    # asked for in a dry run: pyproject.toml's lower bound; 9.24 to 9.26 fail here)
    assert all("modal_gpu=L4, modal_max_cost_usd=5.0" in j for j in per_image[1:])
    functions = functions_of(server, calls)
    # the per-image rule's threads, in milli-CPUs as Modal's FunctionOptions has them
    assert {f.definition.resources.milli_cpu for f in functions} == {1000}
    assert len({f.app_id for f in functions}) == 1  # one app for the run
    # a container per input (no stale volume view)
    assert all(f.definition.single_use_containers for f in functions)
    # the container's Snakemake uses the CPUs the container reserved
    assert all(" --cores 1 " in c["args"][0]["command"] for c in calls)
    targets = sorted(len(c["args"][0]["job_outputs"]) for c in calls)
    assert targets == [2, 3, 3]
    # each shard's timeout is its own time limit (the sum of its jobs' runtime, the
    # profile's gpu=1 of local scope making Snakemake add them up), not the
    # profile's modal-timeout of 6 h: ceil((3 x (n x s + k x 15 s) + 120 s) / 60)
    # minutes for n images of k configurations at the dry run's s per image on L4
    spi = float(re.search(r"on Modal \(L4.*?; ([\d.]+) s per image", dry.stderr)[1])
    for c in calls:
        outputs = c["args"][0]["job_outputs"]
        configs = {
            (e, a)
            for o in outputs
            for e, a in CONFIGURATIONS
            if {e, a} <= set(Path(o).parts)
        }
        n, k = len(outputs), len(configs)
        minutes = math.ceil((3 * (n * spi + k * 15) + 120) / 60)
        assert c["timeout"] == 60 * minutes, (c["timeout"], n, k, spi)
        assert c["startup_timeout"] == 120  # the profile's --modal-startup-seconds
    # the image's layers as the server received them (recorded, not built)
    with server.state.lock:
        commands = [
            line
            for image in server.state.images.values()
            for line in image.dockerfile_commands
        ]
    pip = [line for line in commands if "pip install" in line]
    assert any("multigeom[paper]==" in line for line in pip), pip
    assert any("snakemake==" in line for line in pip), pip


def test_finished_files_kept_on_the_volume_are_those_home(modal_run):
    work, server, result, _ = modal_run
    assert result.returncode == 0, result.stderr[-5000:]
    volume = server.state.volume("wf-test").folder / default_prefix(work)
    files = list((work / "runs" / "per_image").rglob("*.pt"))
    assert len(files) == 8
    for f in files:
        rel = f.relative_to(work)
        assert (volume / rel).read_bytes() == f.read_bytes(), rel


def test_the_modal_token_is_never_written_or_passed(modal_run):
    """MODAL_TOKEN_SECRET was set (the secret the server accepts) and even declared
    with --envvars: it must not reach a job's environment (a secret of its function),
    its arguments, a log, the volume, the uploaded sources or the plugin's records."""
    work, server, result, _ = modal_run
    assert result.returncode == 0, result.stderr[-5000:]
    assert SECRET not in result.stdout + result.stderr
    # the server's folder: volumes, uploaded files, containers' folders and output
    for folder in (server.state.root, work / ".snakemake", work / "logs"):
        for f in folder.rglob("*"):
            if f.is_file() and not f.is_symlink():
                assert SECRET.encode() not in f.read_bytes(), f
    with server.state.lock:
        secrets = list(server.state.secrets.values())
    for env in secrets:  # Secret.from_dict: what the containers' environment gets
        assert "MODAL_TOKEN_SECRET" not in env and SECRET not in env.values()
    for c in spawned(server):
        assert "MODAL_TOKEN_SECRET" not in repr(c["args"])
        assert SECRET not in repr(c["args"])


def test_a_folder_of_test_images_is_refused_before_any_container(
    tiny_run, tmp_path, modal_server
):
    work = workflow_copy(tmp_path / "wf")
    shutil.copytree(tiny_run / "runs" / "demo" / "test_images", work / "photos")
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/modal"]
    cmd += ["--configfile", str(work / "tests" / "data" / TINY_CONFIG.name)]
    cmd += ["--config", "test_images={source: folder, path: photos}", "--cores", "2"]
    result = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    assert result.returncode != 0
    assert "config error: config key 'test_images.source' = 'folder'" in result.stderr
    assert modal_server.state.methods() == []  # Modal was never asked anything


def test_a_rerun_reuses_the_files_on_the_volume(modal_run):
    """Per-image files lost here but committed on the volume (as after a failed
    shard) are taken from the volume by the next run, not computed again; then the
    volume's progress and the local one agree. (Runs last: it changes the run.)"""
    work, server, result, _ = modal_run
    assert result.returncode == 0, result.stderr[-5000:]
    shutil.rmtree(work / "runs" / "per_image")
    n_calls = len(spawned(server))
    config = str(work / "tests" / "data" / TINY_CONFIG.name)
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/modal"]
    cmd += ["--configfile", config, "--cores", "2", "--jobs", "3"]
    cmd += ["--modal-volume", "wf-test", "--until", "estimate_image"]
    cmd += ["--modal-keep-on-volume"]  # as the first run: progress read there below
    rerun = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-5000:]
    calls = spawned(server)
    assert len(calls) == n_calls + 3  # the 3 shards, each finding its files done
    for c in calls[n_calls:]:
        log = work / c["args"][0]["log"]
        assert "reused, nothing run" in log.read_text(), log
    progress = [sys.executable, "-m", "multigeom_workflow.cli", "progress"]
    progress += ["--configfile", config, "--workflow-dir", str(work)]
    here = subprocess.run(progress, cwd=work, capture_output=True, text=True)
    there = subprocess.run(
        [*progress, "--modal-volume", "wf-test"],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert here.returncode == there.returncode == 0, here.stderr + there.stderr
    # per configuration, the same here and on the volume (which holds the first
    # estimates' files: here counts the noise ceiling's second estimates too)
    assert here.stdout.splitlines()[:4] == there.stdout.splitlines()[2:6]
    assert here.stdout.splitlines()[-1].split()[-3:] == ["12", "/", "12"]


@pytest.fixture
def dropping_peer():
    """
    The URL of a peer on 127.0.0.1 that accepts every connection and closes it at
    once, as a proxy that drops them would: the client's requests fail with grpclib's
    ``StreamTerminatedError`` ("Connection lost"), which it retries three times
    (modal/_utils/grpc_utils.py, ``_retry_transient_errors``) before raising it.
    (Where nothing listens the client tries to connect for about 63 s,
    ``create_channel_with_fallbacks``, before its ``ConnectionError``.)
    """
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted, over = [], threading.Event()

    def drop():
        while not over.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            accepted.append(conn.getpeername())
            conn.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        over.set()
        thread.join(5)
        listener.close()


def test_modal_check_on_the_local_server(modal_server, dropping_peer, tmp_path):
    """`modal-check` runs what a real run runs: the profile's image built (the
    build's output shown: the local server's own line per layer, streamed by the
    client), the plugin's container entry starting a one-job Snakemake workflow
    from a scratch folder that imports multigeom_workflow, on the config's GPU
    fallback list, a file through the volume and back, a timeout from the cost cap.
    The server's containers have no GPU and no nvidia-smi, which it reports."""
    config = tmp_path / "gpu.yaml"
    config.write_text("modal:\n  gpu: L4,T4\n")
    cmd = [sys.executable, "-m", "multigeom_workflow.cli", "modal-check"]
    cmd += ["--configfile", str(config)]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    out = result.stdout
    # the build's output is shown (the client prints the image's build logs)
    assert re.search(
        r"^local Modal server: image im-\w+ recorded, not built$", out, re.M
    )
    assert "image build (or cache lookup) and app start:" in out
    assert "cold start:" in out
    assert "GPU job on L4,T4:" in out and "USD" in out
    assert "job log: multigeom_workflow from" in out  # the job's own Python found it
    assert "volume round trip: ok" in out, result.stderr[-3000:]
    assert result.returncode == 1
    assert "nvidia-smi found no GPU" in result.stderr
    assert "torch sees no GPU in the container" in result.stderr
    assert "could not import multigeom_workflow" not in result.stderr
    (call,) = spawned(modal_server)
    (function,) = functions_of(modal_server, [call])
    # the plugin's container entry (pickled by reference to its module), on the
    # fallback list's own function; 0.25 USD at the container's price (the dearest
    # type, L4, 0.000222 USD/s, with one core at 0.0000131 and 128 MiB at 0.00000222
    # per GiB: 0.00023538 USD/s) buys 1062 s at most: 120 s of start-up
    # (startup_timeout) and 942 s of timeout
    assert b"snakemake_executor_plugin_modal.container" in (
        function.definition.function_serialized
    )
    assert call["function"] == "run_job_gpu" and call["status"] == (
        "GENERIC_STATUS_SUCCESS"
    )
    assert call["gpus"] == ["L4:1", "T4:1"]
    assert (call["timeout"], call["startup_timeout"]) == (942, 120)
    assert "python -m snakemake" in call["args"][0]["command"]
    # the check's files are gone from the volume, the app stopped
    folder = modal_server.state.volume("multigeom-fig4de").folder
    assert not [p for p in folder.rglob("*") if p.is_file()]
    assert {a.state_name for a in modal_server.state.apps.values()} == {
        "APP_STATE_STOPPED"
    }
    too_little = subprocess.run(
        [*cmd, "--max-cost-usd", "0.001"], capture_output=True, text=True
    )
    assert too_little.returncode == 2
    assert (
        "--max-cost-usd 0.001 buys 0 s of L4,T4 beyond its 120 s of start-up"
        in too_little.stderr
    )
    unknown = config.with_name("b300.yaml")
    unknown.write_text("modal:\n  gpu: B300\n")
    refused = subprocess.run(
        [*cmd[:-2], "--configfile", str(unknown)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert "config key 'modal.gpu' = 'B300'" in refused.stderr
    n_containers = len(modal_server.state.containers)
    # a token Modal refuses, and Modal out of reach: one line each, no traceback
    url, accepted = dropping_peer
    for fault, said in (
        (
            {"MODAL_TOKEN_SECRET": "as-revoked"},
            "Modal refused the credentials (AuthError: Token ID or secret is invalid)",
        ),
        (
            {"MODAL_SERVER_URL": url},
            "Modal could not be reached to upload to the volume 'multigeom-fig4de' "
            "(StreamTerminatedError: Connection lost)",
        ),
    ):
        failed = subprocess.run(
            cmd, env={**os.environ, **fault}, capture_output=True, text=True
        )
        assert failed.returncode == 2, failed.stderr[-2000:]
        assert said in failed.stderr
        assert "Traceback" not in failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert len(accepted) >= 4  # the first request and its three retries
    assert modal_server.state.calls_of("VolumeGetOrCreate")[-1].status == (
        "UNAUTHENTICATED"
    )
    assert len(modal_server.state.containers) == n_containers  # nothing ran


def test_what_a_modal_run_would_refuse_is_said_before_the_image_is_built(
    tmp_path, modal_server
):
    """Without a token, on a GPU type Modal does not offer and above the budget: the
    dry run of the Modal profile says all of it as warnings (and exits 0); the run
    stops with the same lines before any image is built or job submitted."""
    work = workflow_copy(tmp_path / "wf")
    over = work / "tests" / "data" / "modal-over.yaml"
    over.write_text("modal:\n  gpu: B300\n  max_cost_usd: 0.0001\n")
    # no token in the environment, and no .modal.toml (MODAL_CONFIG_PATH: no file)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODAL_TOKEN")}
    assert not Path(env["MODAL_CONFIG_PATH"]).exists()
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/modal"]
    cmd += ["--configfile", str(work / "tests" / "data" / TINY_CONFIG.name)]
    cmd += [str(over), "--cores", "2"]
    dry = subprocess.run(
        [*cmd, "-n"], cwd=work, env=env, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    warned = [
        line
        for line in dry.stderr.splitlines()
        if line.startswith("warning: a run on Modal would stop:")
    ]
    assert any("no Modal credentials" in line for line in warned), warned
    assert any("config key 'modal.gpu' = 'B300'" in line for line in warned), warned
    assert any("budget:" in line for line in warned), warned
    # the same dry run for a local run says nothing of Modal's refusals
    local = [sys.executable, "-m", "snakemake", "-n", "--cores", "2"]
    local += ["--configfile", str(work / "tests" / "data" / TINY_CONFIG.name)]
    local_dry = subprocess.run(
        [*local, str(over)], cwd=work, env=env, capture_output=True, text=True
    )
    assert local_dry.returncode == 0, local_dry.stderr[-3000:]
    assert "a run on Modal would stop" not in local_dry.stderr
    run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert "no Modal credentials: run `modal token new`" in run.stderr
    assert "config key 'modal.gpu' = 'B300'" in run.stderr
    assert modal_server.state.methods() == []  # no image, no app, no volume


def test_a_mistyped_volume_is_said_not_counted_as_empty(tmp_path, modal_server):
    """Modal looks a volume up lazily: progress on a volume that does not exist says
    so (exit status 2), instead of counting no file there."""
    modal_cli("volume", "create", "multigeom-fig4de")
    cmd = [sys.executable, "-m", "multigeom_workflow.cli", "progress"]
    cmd += ["--configfile", str(TINY_CONFIG), "--workflow-dir", str(REPO)]
    typo = subprocess.run(
        [*cmd, "--modal-volume", "multigeom-fig4d"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert typo.returncode == 2
    assert "--modal-volume 'multigeom-fig4d': no such volume on Modal" in typo.stderr
    assert "0 /" not in typo.stdout
    assert modal_server.state.calls_of("VolumeGetOrCreate")[-1].status == "NOT_FOUND"
    there = subprocess.run(
        [*cmd, "--modal-volume", "multigeom-fig4de"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert there.stdout.splitlines()[-1].split()[-3:] == ["0", "/", "8"], there.stderr


def test_modal_check_gives_up_on_a_call_at_its_deadline():
    """`modal-check` waits for its call at most its timeout, start-up and a margin:
    a call whose end Modal never reports is cancelled then, not polled for ever."""
    from multigeom_workflow.on_modal.check import wait_for_call

    class Call:
        polls, cancelled = 0, False

        def poll(self):
            self.polls += 1
            return None

        def cancel(self):
            self.cancelled = True

    now = [0.0]
    call = Call()
    outcome = wait_for_call(
        call, 10, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0]
    )
    assert outcome is None and call.cancelled
    assert call.polls == 11 and now[0] == 10  # once a second, then given up

    class Ends(Call):
        def poll(self):
            self.polls += 1
            return "ended" if self.polls == 3 else None

    ends = Ends()
    assert wait_for_call(ends, 10, sleep=lambda s: None) == "ended"
    assert not ends.cancelled


@pytest.mark.parametrize("cap_usd", [0.25, 1.0])
def test_modal_check_cap_holds_its_start_up_and_timeout(cap_usd):
    """`modal-check`'s cap is hard: what Modal may bill, the container's price (its
    GPU, the one core it asks and Modal's default memory) x (the start-up declared
    as ``startup_timeout`` + the timeout), fits in it, as the plugin's ledger counts
    a call's worst case (A100-80GB, the paper's GPU). The GPU alone would buy more
    seconds than the cap holds (a newcomer found 0.2547 USD for 0.25)."""
    from snakemake_executor_plugin_modal.calls import STARTUP_S, Ledger
    from snakemake_executor_plugin_modal.prices import ContainerRequest, parse_gpu

    from multigeom_workflow.on_modal.check import CHECK_CPU, check_gpu, check_timeout

    gpu, usd_per_s = check_gpu("A100-80GB")
    container = ContainerRequest(parse_gpu("A100-80GB"), cpu=CHECK_CPU)
    # the GPU, one core and 128 MiB at Modal's rates (prices.py)
    assert usd_per_s == pytest.approx(
        gpu.usd_per_second + 1 * 0.0000131 + 0.125 * 0.00000222
    )
    timeout_s = check_timeout(cap_usd, usd_per_s, STARTUP_S)
    ledger = Ledger()
    assert ledger.startup_s == STARTUP_S
    assert ledger.worst_case(container, timeout_s) <= cap_usd
    assert ledger.worst_case(container, timeout_s + 1) > cap_usd
    assert ledger.worst_case(container, timeout_s) > ledger.worst_case(gpu, timeout_s)


@pytest.mark.parametrize(
    ("budget", "at_once"), [(None, 10), (30, 5)], ids=["shipped", "30-usd"]
)
def test_the_paper_s_dry_run_on_modal_starts_every_shard(
    tmp_path, modal_server, budget, at_once
):
    """`snakemake -n --profile profiles/modal --configfile config/paper.yaml`, as a
    user types it: its plan is 10 containers, and with the shipped budget (60 USD)
    no line says that fewer start at once; with 30 USD the line says 5 of the 10
    (each shard's worst case about 5.4 USD: A100-80GB at 0.000694 USD/s for its time
    limit and the 120 s start-up). The dry run asks Modal nothing."""
    work = workflow_copy(tmp_path / "wf")
    cmd = [sys.executable, "-m", "snakemake", "-n", "--profile", "profiles/modal"]
    cmd += ["--configfile", "config/paper.yaml"]
    if budget is not None:
        cmd += ["--config", f"modal={{max_cost_usd: {budget}}}"]
    dry = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    out = dry.stdout + dry.stderr
    assert "on Modal (A100-80GB, 0.000694 USD/s): 10 container(s)" in out, out[-3000:]
    held = [line for line in out.splitlines() if "holds the worst case of" in line]
    if at_once == 10:
        assert held == []
    else:
        (line,) = held
        assert line.startswith(
            f"warning: modal.max_cost_usd = {budget:.2f} USD holds the worst case "
            f"of {at_once} of the 10 shards at once"
        )
    assert modal_server.state.methods() == []
