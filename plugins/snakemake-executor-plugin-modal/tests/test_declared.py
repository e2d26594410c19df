"""
What the plugin sends over the wire, read where it arrives: the plugin's own
``RunApp`` declares its functions through the installed ``modal`` client, unmodified,
against the local Modal server (``tests/modal_server``), which records what
``FunctionCreate`` and ``FunctionBindParams`` carry (issue 37).

The client runs in a subprocess (``modal.client`` keeps one client per process); it
prints what the test needs as JSON on its last line.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from .modal_server import serve

#: The client's script: the plugin's app, as ``Executor.__post_init__`` makes it
#: (default settings, a GPU, a fallback list), and one job bound as ``RunApp.spawn``
#: binds it; prints the app id and the ledger's start-up and worst case.
_DECLARE = """
import json, sys
import modal
assert "site-packages" in modal.__file__, modal.__file__
from snakemake_executor_plugin_modal import ExecutorSettings
from snakemake_executor_plugin_modal.calls import Ledger, RunApp
from snakemake_executor_plugin_modal.image import container_image
from snakemake_executor_plugin_modal.prices import ContainerRequest, parse_gpu

settings = ExecutorSettings()
ledger = Ledger(startup_s=float(settings.startup_seconds))  # as the Executor's
volume = modal.Volume.from_name("run", create_if_missing=True)
gpu = parse_gpu("A100-80GB")
fallback = parse_gpu("H100,A100-80GB")
app = RunApp(
    "declared",
    container_image([], [], []),
    volume,
    settings.timeout,
    gpu,
    fallback_gpus=[fallback],
    startup_timeout_s=int(settings.startup_seconds),
)
try:
    app.bound(gpu, 2.0, 4096, 900).hydrate()
    app.bound(fallback, 2.0, None, 700).hydrate()
    app.bound(None, 1.0, None, 300).hydrate()
    out = {
        "app_id": app.app_id,
        "startup_s": ledger.startup_s,
        "worst_900": ledger.worst_case(ContainerRequest(gpu, 2.0, 4096), 900),
        "timeout": settings.timeout,
    }
finally:
    app.stop()
print(json.dumps(out))
"""


def _run_client(server, script: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=server.client_env(),
        cwd=server.state.root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.fail(f"client failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.modal_server
def test_the_start_up_modal_receives_is_what_the_ledger_holds(tmp_path):
    """
    Every function the plugin declares, and every job bound from one, reaches
    Modal with ``startup_timeout_secs`` equal to the ledger's start-up allowance:
    a container may bill at most its start-up and its timeout, which is the worst
    case the budget holds (``Ledger.worst_case``). Modal 1.6.4 would otherwise send
    the timeout as start-up timeout (``startup_timeout or timeout``,
    ``modal/app.py``) and ``with_options`` cannot change it.
    """
    with serve(tmp_path / "server") as server:
        out = _run_client(server, _DECLARE)
        state = server.state
        names = ("run_job", "run_job_gpu", "run_job_gpu1")
        declared = [state.function(n, out["app_id"]) for n in names]
        variants = [f for f in state.functions.values() if f.app_id == out["app_id"]]
    assert out["startup_s"] > 0
    bound = [f for f in variants if f.base_function_id]
    assert len(bound) == 3
    for f in [*declared, *bound]:
        assert f.definitions
        for d in f.definitions:  # one per GPU of a fallback list
            assert d.startup_timeout_secs == out["startup_s"], f.name
    assert [d.timeout_secs for f in declared for d in f.definitions] == [
        out["timeout"]
    ] * 4
    # the bound job's worst case is the ledger's, from what Modal received: its
    # GPU, cores and memory at Modal's rates (A100-80GB 0.000694 USD/s, a physical
    # core 0.0000131 USD/s, a GiB 0.00000222 USD/s; July 2026) for its timeout and
    # start-up
    gpu_job = next(f for f in bound if f.options.timeout_secs == 900)
    d = gpu_job.definition
    assert gpu_job.gpus == ["A100-80GB:1"]
    resources = gpu_job.options.resources
    cores, gib = resources.milli_cpu / 1000, resources.memory_mb / 1024
    assert (cores, gib) == (2.0, 4.0)
    usd_per_s = 0.000694 + cores * 0.0000131 + gib * 0.00000222
    billed_at_most = usd_per_s * (d.timeout_secs + d.startup_timeout_secs)
    assert billed_at_most == pytest.approx(out["worst_900"])
