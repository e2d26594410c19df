"""
What a run would refuse, found before the container image is built: missing
credentials, a default storage provider, a GPU type Modal does not offer (or whose
price is unknown, so no budget can guard it), a job whose own expected cost is above
its budget, inputs outside the working directory, a Python Modal's image builder does
not offer, a local package that cannot be copied into the image.

The executor raises them all at once before anything is built; a workflow's dry run
can say them as warnings (:func:`settings_problems` needs no DAG, and
:func:`requested_settings` tells whether this Snakemake process was started with
``--executor modal``, a dry run too).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from snakemake_interface_common.exceptions import WorkflowError

from .earlier import EARLIER_APPS
from .image import check_python_version
from .ledger import Ledger
from .limits import STARTUP_S
from .prices import (
    give_prices,
    parse_gpu,
    parse_prices,
    price_per_second,
    price_table,
)
from .resources import container_request
from .staging import relative_to_workdir

__all__ = [
    "OAUTH_SETTINGS",
    "credentials_problem",
    "gpu_problem",
    "job_problems",
    "known_gpu_types",
    "oauth_in_use",
    "requested_settings",
    "settings_problems",
]

_REQUESTED: dict = {"settings": None}


def _record(settings) -> None:
    """Called by ``ExecutorSettings.__post_init__``: Snakemake made the settings of
    ``--executor modal`` in this process (its command line or profile asked for it).
    Their GPU prices are given to the price table (malformed ones are left to
    :func:`settings_problems`, which names them)."""
    _REQUESTED["settings"] = settings
    try:
        give_prices(parse_prices(getattr(settings, "gpu_prices", None) or []))
    except ValueError:
        pass


def requested_settings():
    """
    The ``ExecutorSettings`` that Snakemake made in this process for ``--executor
    modal`` (a dry run with ``--profile modal`` too on Snakemake 9.27 and later, which
    keep the executor asked for beside their dry-run one; 9.19 to 9.26 made only the
    dry-run executor's settings), or None if none was made.
    """
    return _REQUESTED["settings"]


def known_gpu_types() -> list[str]:
    """GPU types the plugin knows Modal to offer and can price (with aliases)."""
    from .prices import _ALIASES

    return sorted({*price_table(), *_ALIASES})


#: Modal's OAuth settings (modal 1.6.4, ``modal/config.py``: read from
#: ``MODAL_OAUTH_<NAME>`` or ``.modal.toml``), by the environment variable that gives
#: each; a set is complete with the refresh token, the client id and the client
#: secret or the JWT key.
OAUTH_SETTINGS = {
    "oauth_refresh_token": "MODAL_OAUTH_REFRESH_TOKEN",
    "oauth_client_id": "MODAL_OAUTH_CLIENT_ID",
    "oauth_client_secret": "MODAL_OAUTH_CLIENT_SECRET",
    "oauth_jwt_key": "MODAL_OAUTH_JWT_KEY",
}


#: What the client's private-key OAuth imports (modal 1.6.4,
#: ``modal/_utils/oauth.py``, ``OAuthAssertionProvider``: modal's ``oauth`` extra).
_JWT_MODULES = ("jwt", "cryptography")


def _setting(key: str):
    """The installed client's setting `key` (``modal.config``), None where unset or
    unknown to it."""
    from modal.config import config as modal_config

    try:
        return modal_config.get(key)
    except KeyError:  # a client without the setting
        return None


def oauth_in_use() -> bool:
    """Whether the client is given OAuth settings (`OAUTH_SETTINGS`) rather than a
    token: the credentials a refusal (``AuthError``) is about."""
    return any(_setting(name) for name in OAUTH_SETTINGS)


def credentials_problem() -> str | None:
    """
    Why Modal's client has no credentials it can use (``modal.config``), or None.
    Modal takes either a token (``token_id`` and ``token_secret``: ``modal token
    new``, ``MODAL_TOKEN_ID`` and ``MODAL_TOKEN_SECRET``) or an OAuth set
    (`OAUTH_SETTINGS`: a refresh token, a client id and exactly one of a client
    secret or a JWT key, the key needing modal's ``oauth`` extra), never both and
    never a part of one (modal 1.6.4, ``modal/config.py``: its module docstring and
    ``_lookup_workspace``; ``modal/client.py``, ``_Client.from_env``;
    ``modal/_utils/oauth.py``).
    """
    token = [_setting("token_id"), _setting("token_secret")]
    oauth = {name: _setting(name) for name in OAUTH_SETTINGS}
    if any(token) and any(oauth.values()):
        return (
            "Modal credentials: a token (MODAL_TOKEN_ID, MODAL_TOKEN_SECRET or "
            ".modal.toml) and OAuth settings (MODAL_OAUTH_*) are both set, and Modal "
            "refuses both at once: unset one of them"
        )
    if any(oauth.values()):
        missing = [
            OAUTH_SETTINGS[name]
            for name in ("oauth_refresh_token", "oauth_client_id")
            if not oauth[name]
        ]
        if not (oauth["oauth_client_secret"] or oauth["oauth_jwt_key"]):
            missing.append("MODAL_OAUTH_CLIENT_SECRET or MODAL_OAUTH_JWT_KEY")
        if missing:
            return f"Modal OAuth credentials are incomplete: {', '.join(missing)} unset"
        if oauth["oauth_client_secret"] and oauth["oauth_jwt_key"]:
            return (
                "Modal OAuth credentials: MODAL_OAUTH_CLIENT_SECRET and "
                "MODAL_OAUTH_JWT_KEY are both set, and Modal takes exactly one of "
                "them: unset the other"
            )
        absent = [m for m in _JWT_MODULES if importlib.util.find_spec(m) is None]
        if oauth["oauth_jwt_key"] and absent:
            return (
                "Modal OAuth credentials: MODAL_OAUTH_JWT_KEY needs modal's 'oauth' "
                f"extra ({', '.join(absent)} not installed): "
                "pip install 'modal[oauth]'"
            )
        return None
    if all(token):
        return None
    return (
        "no Modal credentials: run `modal token new` once (or set MODAL_TOKEN_ID and "
        "MODAL_TOKEN_SECRET, or Modal's OAuth settings MODAL_OAUTH_*), then start the "
        "run again"
    )


def gpu_problem(spec, where: str) -> str | None:
    """
    Why a GPU specification would be refused: malformed, or a type that is not in
    the plugin's table of Modal's GPUs (Modal checks the type only on its server,
    after the image is built; without a price no budget can guard it).

    Parameters
    ----------
    spec : str or list of str
        ``"H100"``, ``"H100:2"``, ``"A100-80GB,H100"``.
    where : str
        What holds it (``"--modal-gpu"``, ``"job x: resource modal_gpu"``).
    """
    try:
        request = parse_gpu(spec)
    except ValueError as e:
        return f"{where}: {e}"
    unknown = [t for t in request.types if price_per_second(t) != price_per_second(t)]
    if unknown:
        return (
            f"{where} = {spec!r}: GPU type {unknown[0]!r} is not one the plugin knows "
            "Modal to offer, with its price (no budget can guard a GPU without one); "
            "if Modal sells it, give its price per GPU-second from Modal's price page "
            f"as --modal-gpu-prices {unknown[0]}=<USD> (a profile's modal-gpu-prices); "
            f"allowed: {', '.join(known_gpu_types())}"
        )
    return None


#: Modal's rule for an object's name (``is_valid_object_name`` and ``app_id_regex``
#: in ``modal/_utils/name_utils.py``, Modal 1.6), checked before the build: the server
#: refuses a volume of another name only when the run first uses it.
_OBJECT_NAME = re.compile(r"^[a-zA-Z0-9-_.]+$")
_APP_ID = re.compile(r"^ap-[a-zA-Z0-9]{22}$")


def valid_object_name(name: str) -> bool:
    """Whether Modal accepts `name` for a volume (or another named object)."""
    return (
        len(name) <= 64
        and _OBJECT_NAME.match(name) is not None
        and _APP_ID.match(name) is None
    )


def settings_problems(settings, workflow=None) -> list[str]:
    """
    What the run's settings alone would refuse (no DAG needed): credentials, a
    default storage provider, the volume's name, ``--modal-gpu``, the Python
    version, the local packages.

    Parameters
    ----------
    settings : ExecutorSettings
    workflow : snakemake workflow, optional
        For its storage settings.

    Returns
    -------
    list of str
        One line each; empty if nothing would be refused.
    """
    problems = []
    missing = credentials_problem()
    if missing:
        problems.append(missing)
    try:
        parse_prices(getattr(settings, "gpu_prices", None) or [])
    except ValueError as e:
        problems.append(str(e))
    # read without a default: the executor checks at start that Snakemake has it
    # (`snakemake_reads`); a dry run's preflight passes no workflow
    provider = (
        None if workflow is None else workflow.storage_settings.default_storage_provider
    )
    if provider:
        problems.append(
            f"--default-storage-provider {provider}: the Modal executor moves files "
            "through its own volume and does not install storage plugins in the "
            "container; run without a default storage provider"
        )
    name = getattr(settings, "volume", None)
    if isinstance(name, str) and not valid_object_name(name):
        problems.append(
            f"--modal-volume {name!r}: Modal refuses this name (at most 64 letters, "
            "digits, '-', '_' or '.', and not an app id); choose another"
        )
    if settings.gpu is not None:
        problem = gpu_problem(settings.gpu, "--modal-gpu")
        if problem:
            problems.append(problem)
    earlier = getattr(settings, "earlier_apps", "stop")
    if earlier not in EARLIER_APPS:
        problems.append(
            f"--modal-earlier-apps {earlier!r}: one of "
            f"{', '.join(EARLIER_APPS)} (what a run does with the apps of earlier "
            "runs of the workflow still running)"
        )
    try:
        check_python_version(sys.version_info)
    except WorkflowError as e:
        problems.append(str(e))
    for name in settings.local_packages or []:
        if isinstance(name, str):
            try:
                found = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                problems.append(
                    f"--modal-local-packages: {name!r} is not importable here, so it "
                    "cannot be copied into the image; name an importable package of "
                    "Python source files"
                )
    return problems


def job_problems(executor, jobs, workdir: Path) -> list[str]:
    """
    What the planned jobs would be refused for: inputs outside the working
    directory, a GPU request that cannot be served (no type known, an unknown type,
    malformed), and a job whose own expected cost (its ``runtime`` resource) is above
    its budget with nothing spent yet.

    Parameters
    ----------
    executor : Executor
        For its ``gpu_request`` and ``budget`` of a job.
    jobs : iterable
        The jobs the run will submit (not local ones).
    workdir : Path

    Returns
    -------
    list of str
        One line per problem, the first of each kind per rule.
    """
    problems, seen = [], set()

    def add(kind: str, rule: str, text: str) -> None:
        if (kind, rule) not in seen:
            seen.add((kind, rule))
            problems.append(text)

    for job in jobs:
        rule = job.rule.name
        for f in job.input:
            try:
                relative_to_workdir(f, workdir)
            except WorkflowError as e:
                add("outside", rule, f"job {rule}: {e}")
                break
        try:
            gpu = executor.gpu_request(job)
            budget = executor.budget(job)
        except WorkflowError as e:
            add("gpu", rule, str(e))
            continue
        if gpu is not None:
            problem = gpu_problem(
                list(gpu.modal_spec) if gpu.fallbacks else gpu.modal_spec,
                f"job {rule}: GPU",
            )
            if problem:
                add("gpu", rule, problem)
                continue
        runtime = job.resources.get("runtime")
        if budget is not None and isinstance(runtime, (int, float)) and runtime > 0:
            startup = getattr(executor.settings, "startup_seconds", STARTUP_S)
            ledger = Ledger(startup_s=float(startup))
            request = container_request(job, gpu)
            refusal = ledger.refusal(request, float(runtime) * 60, 0.0, budget)
            if refusal:
                add("budget", rule, f"job {rule}: {refusal}")
    return problems
