"""
Contract: every Modal name the plugin calls exists in the installed ``modal`` package
with a signature that accepts the plugin's arguments, so that a Modal upgrade that
renames or changes one fails here and not on a user's account; and what the plugin
reads of the client's behaviour (exception classes, marks, declared timeouts), checked
in the client's source or through it against the local Modal server (``modal_server``).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import snakemake_executor_plugin_modal
from snakemake_executor_plugin_modal.app_state import ENDED_STATES
from snakemake_executor_plugin_modal.preflight import OAUTH_SETTINGS

PLUGIN = Path(snakemake_executor_plugin_modal.__file__).parent

# (object path, arguments the plugin passes): bound against the signature.
CALLS = [
    ("App", (), {"name": "x"}),
    (
        "App.function",
        ("self",),
        dict(
            image=None,
            gpu=["A100-80GB", "H100"],  # a fallback list: allowed here only
            timeout=60,
            volumes={},
            serialized=True,
            single_use_containers=True,
            secrets=[],
            ephemeral_disk=10240,
            name="run_job_gpu",
        ),
    ),
    ("App.run", ("self",), {}),
    (
        "Function.with_options",
        ("self",),
        dict(cpu=2.0, memory=4096, gpu="H100", timeout=60),
    ),
    ("Function.spawn", ("self", {"spec": 1}), {}),
    ("Secret.from_dict", ({"A": "1"},), {}),
    ("enable_output", (), {}),
    ("FunctionCall.get", ("self",), {"timeout": 0}),
    ("FunctionCall.cancel", ("self",), {"terminate_containers": True}),
    ("Image.debian_slim", (), {"python_version": "3.11"}),
    ("Image.pip_install", ("self", "snakemake==9.0"), {}),
    ("Image.run_commands", ("self", "echo cached"), {}),
    ("Image.add_local_python_source", ("self", "snakemake_executor_plugin_modal"), {}),
    ("Image.build", ("self",), {}),
    ("Volume.from_name", ("vol",), {"create_if_missing": True}),
    ("Volume.listdir", ("self", "prefix"), {"recursive": True}),
    ("Volume.read_file", ("self", "prefix/a.txt"), {}),
    ("Volume.batch_upload", ("self",), {"force": True}),
    ("Volume.commit", ("self",), {}),
    ("Volume.reload", ("self",), {}),
    ("Volume.remove_file", ("self", "prefix/a.txt"), {}),
    ("Volume.hydrate", ("self",), {}),
    ("volume.VolumeUploadContextManager.put_file", ("self", "a", "/b"), {}),
    (
        "App.function",
        ("self",),
        dict(image=None, gpu="T4", timeout=60, volumes={}, startup_timeout=120),
    ),
    ("config.config.get", ("token_id",), {}),
    ("App.info", ("self",), {"refresh": True}),  # app_state.app_stopped
]
ATTRIBUTES = [
    "App.app_id",
    "FunctionCall.object_id",
    "exception.TimeoutError",
    "exception.FunctionTimeoutError",
    "exception.NotFoundError",
    "exception.Error",
    "exception.OutputExpiredError",
    "exception.ConnectionError",
    "exception.InternalError",
    "exception.ServiceError",
    "exception.AuthError",
    "exception.ResourceExhaustedError",
    "exception.RemoteError",
    "exception.InvalidError",
    "exception.ImageBuildError",
    "exception.ModuleNotMountable",
    "volume.FileEntryType.FILE",
    "exception.InternalFailure",
    *(f"types.AppState.{s.upper()}" for s in ENDED_STATES),
]


def real_modal():
    """The installed ``modal``, with the submodules the plugin reads loaded."""
    import importlib

    import modal

    for sub in ("exception", "volume", "config", "types"):
        importlib.import_module(f"modal.{sub}")
    return modal


@pytest.fixture
def backend():
    """The installed ``modal`` client."""
    return real_modal()


def resolve(module, dotted: str):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize(("name", "args", "kwargs"), CALLS, ids=[c[0] for c in CALLS])
def test_called_names_accept_the_plugins_arguments(backend, name, args, kwargs):
    target = resolve(backend, name)
    inspect.signature(target).bind(*args, **kwargs)


@pytest.mark.parametrize("name", ATTRIBUTES)
def test_used_attributes_exist(backend, name):
    resolve(backend, name)


def test_get_timeout_raises_pythons_timeout_error():
    """
    ``FunctionCall.get(timeout=0)`` on a running call raises Python's ``TimeoutError``
    (not ``modal.exception.TimeoutError``, a different class): the plugin takes both
    as "still running". Read from the installed source of ``_FunctionCall.get``.
    """
    modal = real_modal()
    from modal import _functions

    source = inspect.getsource(_functions)
    assert "raise TimeoutError()" in source
    assert "TimeoutError" not in _imported_from_exception(source)
    assert not issubclass(modal.exception.TimeoutError, TimeoutError)


def _imported_from_exception(source: str) -> str:
    tree = ast.parse(source)
    names = [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and (node.module or "").endswith("exception")
        for alias in node.names
    ]
    return " ".join(names)


def test_exception_hierarchy_as_the_plugin_relies_on(backend):
    """Modal's exceptions sit where the plugin expects them: an expired output is a
    Modal TimeoutError (the plugin must test it before "still running"), a function
    timeout too, and an image build failure a RemoteError."""
    exc = backend.exception
    assert issubclass(exc.OutputExpiredError, exc.TimeoutError)
    assert issubclass(exc.FunctionTimeoutError, exc.TimeoutError)
    assert issubclass(exc.ImageBuildError, exc.RemoteError)
    assert not issubclass(exc.TimeoutError, TimeoutError)
    for name in ("ConnectionError", "InternalError", "ServiceError", "ExecutionError"):
        assert issubclass(getattr(exc, name), exc.Error), name
    assert "modal image logs" in str(
        exc.ImageBuildError("failed; modal image logs im-1", "im-1")
    )
    assert exc.ImageBuildError("failed", "im-1").image_id == "im-1"
    assert issubclass(exc.AuthError, exc.Error)
    # a local package that cannot be mounted: no modal.exception.Error
    assert not issubclass(exc.ModuleNotMountable, exc.Error)


def test_with_options_takes_one_gpu_type_only():
    """Modal 1.6's ``with_options`` reads ``gpu`` as one string (a list is refused by
    ``parse_gpu_config``), so a fallback list must go to ``App.function``."""
    real_modal()
    from modal._function_variants import _FunctionOptions
    from modal._utils.function_utils import parse_gpu_config

    source = inspect.getsource(_FunctionOptions.new)
    assert "gpu: str | None" in source
    with pytest.raises(Exception, match="Invalid GPU config"):
        parse_gpu_config(["A100", "H100"])


def test_supported_python_series_are_modals():
    real_modal()
    from modal._image import SUPPORTED_PYTHON_SERIES

    from snakemake_executor_plugin_modal.image import PYTHON_SERIES

    for builder in ("2025.06", "2026.10"):
        assert set(PYTHON_SERIES) <= set(SUPPORTED_PYTHON_SERIES[builder]), builder


def test_poll_takes_pythons_timeout_error_as_running():
    from snakemake_executor_plugin_modal.calls import ContainerCall

    class Running:
        def get(self, timeout=None):
            raise TimeoutError()

    assert ContainerCall(Running(), None, 60).poll() is None


def test_upload_context_offers_put_file():
    real_modal()
    from modal.volume import VolumeUploadContextManager

    sig = inspect.signature(VolumeUploadContextManager.put_file)
    sig.bind("self", "local/path", "/remote/path")


def modal_names(tree: ast.AST) -> set[str]:
    """Attributes read from ``modal`` (``modal.X``, ``modal.exception.X``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "modal":
                names.add(node.attr)
            elif (
                isinstance(base, ast.Attribute)
                and isinstance(base.value, ast.Name)
                and base.value.id == "modal"
            ):
                names.add(node.attr)
    return names


#: Methods called on Modal's objects (a volume, a function, a call, an app, an image,
#: a batch upload), by the plugin or the workflow's on_modal/ modules: each must be in
#: CALLS, so that its signature is checked against the installed modal.
OBJECT_METHODS = {
    "batch_upload", "build", "cancel", "commit", "function", "hydrate", "listdir",
    "put_file", "read_file", "reload", "remove_file", "spawn", "with_options",
}  # fmt: skip
#: Modal's classes whose methods the plugin calls on objects it holds.
MODAL_CLASSES = ["App", "Function", "FunctionCall", "Volume", "Image", "Secret"]
#: Attribute names of the plugin's code that are also names of those classes' public
#: attributes but are not Modal's (``self.logger.info``, ``pool.map``, ``dict.update``,
#: the plugin's own ``RunApp.stop``/``.app``/``.name``, ``self.workdir``; the
#: ``description`` of ``AppListResponse.AppListItem`` that ``earlier`` reads, checked
#: in tests/test_earlier.py).
NOT_MODALS = {"info", "map", "update", "stop", "app", "name", "workdir", "description"}
#: The workflow's Modal modules, found from this test file (the plugin installs
#: non-editable: `PLUGIN` is then in site-packages, where no workflow is).
WORKFLOW_ON_MODAL = (
    Path(__file__).resolve().parents[3] / "src" / "multigeom_workflow" / "on_modal"
)


def _called_methods(tree: ast.AST) -> set[str]:
    return {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }


def test_file_entry_fields_are_modals(backend):
    """The fields of a listed entry the plugin reads (path, type, mtime, size)."""
    import dataclasses

    fields = [f.name for f in dataclasses.fields(backend.volume.FileEntry)]
    assert fields == ["path", "type", "mtime", "size"]
    assert backend.volume.FileEntryType.FILE == 1


def test_every_method_called_on_modal_objects_is_in_the_contract():
    """Calls on Modal's objects (``volume.remove_file(...)``, ``app.run()``, ...) in
    the plugin and in the workflow's on_modal/ modules: each one is checked."""
    sources = [*PLUGIN.glob("*.py")]
    if WORKFLOW_ON_MODAL.is_dir():  # the plugin's own checkout has no workflow
        sources += [*WORKFLOW_ON_MODAL.glob("*.py")]
    called = set()
    for f in sources:
        called |= _called_methods(ast.parse(f.read_text()))
    covered = {n.split(".")[-1] for n, _, _ in CALLS}
    assert {"remove_file", "listdir", "batch_upload", "spawn"} <= called
    assert called & OBJECT_METHODS <= covered, (called & OBJECT_METHODS) - covered
    assert {"run", "get"} <= covered  # App.run(), FunctionCall.get(timeout=0)


def test_every_modal_name_in_the_workflow_is_in_the_contract():
    """The workflow's on_modal/ modules read Modal's names too."""
    if not WORKFLOW_ON_MODAL.is_dir():
        pytest.skip("not in the workflow's checkout")
    covered = {part for n, _, _ in CALLS for part in n.split(".")}
    covered |= {part for a in ATTRIBUTES for part in a.split(".")}
    used = set()
    for f in WORKFLOW_ON_MODAL.glob("*.py"):
        used |= modal_names(ast.parse(f.read_text()))
    assert used <= covered, used - covered


def test_every_modal_name_in_the_plugin_is_in_the_contract():
    """A new Modal name read by the plugin must be added to this contract."""
    covered = {part for n, _, _ in CALLS for part in n.split(".")}
    covered |= {part for a in ATTRIBUTES for part in a.split(".")}
    used = set()
    for f in PLUGIN.glob("*.py"):
        used |= modal_names(ast.parse(f.read_text()))
    assert used, "no Modal name found: the check is broken"
    assert used <= covered, used - covered


def _raise(exc):
    raise exc


def _as_the_real_client_raises_it(exc: BaseException) -> BaseException:
    """`exc` as Modal 1.6 hands a container's exception back: its traceback extracted
    in the container (``extract_traceback``), then the exception unpickled and given
    that traceback by the client (``append_modal_tb``), both of modal/_traceback.py."""
    real_modal()
    import pickle

    from modal._traceback import append_modal_tb, extract_traceback

    try:
        _raise(exc)
    except BaseException as e:
        tb_dict, line_cache = extract_traceback(e, "ta-01TEST")
        again = pickle.loads(pickle.dumps(e))
    append_modal_tb(again, tb_dict, line_cache)
    return again


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("commit timed out"),
        OSError(110, "Connection timed out"),
        OSError(104, "Connection reset by peer"),
        "modal.exception.ConnectionError",
    ],
)
def test_an_exception_from_the_container_is_told_from_the_clients(exc):
    """The marks the plugin reads are the ones the real client sets; the client's own
    exceptions (transport errors, poll_function's bare TimeoutError) carry none."""
    modal = real_modal()
    from snakemake_executor_plugin_modal.calls import ContainerCall, raised_in_container

    if isinstance(exc, str):
        exc = modal.exception.ConnectionError("Deadline exceeded")
    remote = _as_the_real_client_raises_it(exc)
    assert type(remote) is type(exc)
    assert raised_in_container(remote)
    assert not raised_in_container(exc)
    try:
        _raise(type(exc)(*exc.args))
    except BaseException as local:
        assert not raised_in_container(local)

    class Call:
        object_id = "fc-x"

        def get(self, timeout=None):
            raise remote

    outcome = ContainerCall(Call(), None, 60, warn=pytest.fail).poll()
    assert not outcome.ok and outcome.remote
    assert f"the container raised {type(exc).__name__}" in outcome.message


def test_a_containers_exception_is_marked_as_the_plugin_reads_it(modal_server):
    """An ``OSError`` (ETIMEDOUT: a ``TimeoutError`` too) raised in a container of the
    local Modal server reaches ``FunctionCall.get`` marked as the container's, not
    taken for the client's own transport error or "still running"."""
    import modal

    from snakemake_executor_plugin_modal.calls import raised_in_container

    # the container imports this module (tests.test_contract) from the image's copy
    image = modal.Image.debian_slim().add_local_python_source("tests")
    app = modal.App("contract")
    f = app.function(image=image, serialized=True)(_raising_job)
    with app.run():
        call = f.spawn("ETIMEDOUT")
        with pytest.raises(TimeoutError, match="Errno 110") as info:
            call.get(timeout=60)
    assert raised_in_container(info.value)
    assert not raised_in_container(TimeoutError(110, "Connection timed out"))


def _raising_job(kind: str):
    import errno

    if kind == "ETIMEDOUT":
        raise OSError(errno.ETIMEDOUT, "Connection timed out")
    return kind


def _plugin_sources() -> list[Path]:
    sources = [*PLUGIN.glob("*.py")]
    if WORKFLOW_ON_MODAL.is_dir():  # the plugin's own checkout has no workflow
        sources += [*WORKFLOW_ON_MODAL.glob("*.py")]
    return sources


@pytest.fixture
def real_client():
    """The installed modal."""
    return real_modal()


def test_every_modal_method_the_plugin_names_is_checked(real_client):
    """
    Found mechanically, not by a list kept by hand: every attribute the plugin (or
    the workflow's on_modal/ modules) reads that is a public name of one of Modal's
    classes it uses must be in the contract (its signature bound against the real
    client). Fails when a new Modal method is called and nobody added it.
    """
    modal = real_client
    used = set()
    for f in _plugin_sources():
        used |= {
            n.attr
            for n in ast.walk(ast.parse(f.read_text()))
            if isinstance(n, ast.Attribute)
        }
    covered = {n for n, _, _ in CALLS} | set(ATTRIBUTES)
    missing_contract, owned = [], []
    for name in sorted(used - NOT_MODALS):
        owners = [
            cls
            for cls in MODAL_CLASSES
            if not name.startswith("_") and name in dir(getattr(modal, cls))
        ]
        if not owners:
            continue
        owned.append(name)
        if not any(c.split(".")[-1] == name for c in covered):
            missing_contract.append(f"{'/'.join(owners)}.{name}")
    assert missing_contract == [], missing_contract
    assert {"spawn", "listdir", "with_options"} <= set(owned), owned  # it finds some


def _parameters(target) -> dict:
    return {
        p.name: p.kind
        for p in inspect.signature(target).parameters.values()
        if p.name != "self"
    }


@pytest.mark.parametrize(
    "name",
    ["multigeom-fig4de", "a.b_c-1", "x" * 64, "x" * 65, "my volume", "vol/1", "",
     "ap-" + "a" * 22, "ap-short", "é"],
)  # fmt: skip
def test_volume_names_are_checked_by_modals_rule(name):
    """The preflight's check of ``--modal-volume`` agrees with the real client's
    ``is_valid_object_name`` (modal/_utils/name_utils.py)."""
    real_modal()
    from modal._utils.name_utils import is_valid_object_name

    from snakemake_executor_plugin_modal.preflight import valid_object_name

    assert valid_object_name(name) == is_valid_object_name(name)


def test_without_a_startup_timeout_modal_allows_the_whole_timeout(real_client):
    """modal 1.6.4 (``modal/app.py``, ``App.function``) declares a function's
    ``startup_timeout`` as ``startup_timeout or timeout``: the plugin must declare it,
    or a container may spend its whole timeout starting, billed beyond what the
    budget holds (timeout + ``--modal-startup-seconds``)."""
    source = inspect.getsource(real_client.App.function)
    assert "startup_timeout=startup_timeout or timeout" in source
    assert "startup_timeout" not in _parameters(real_client.Function.with_options)


def test_every_function_declares_the_startup_the_budget_holds(modal_server):
    """Each function of the run's app (CPU, GPU, fallback lists) is declared with
    ``startup_timeout`` = ``--modal-startup-seconds``, the start-up its ledger keeps
    aside beyond the timeout: read from what the local Modal server received
    (``FunctionCreate``), per rank of a fallback list."""
    import modal

    from snakemake_executor_plugin_modal.calls import RunApp
    from snakemake_executor_plugin_modal.prices import parse_gpu

    volume = modal.Volume.from_name("startup-test", create_if_missing=True)
    app = RunApp(
        "startup-test",
        modal.Image.debian_slim(),
        volume,
        3600,
        parse_gpu("A100-80GB"),
        fallback_gpus=[parse_gpu("H100,A100-80GB")],
        startup_timeout_s=240,
    )
    try:
        app_id = app.app_id
        functions = [
            modal_server.state.function(name, app_id)
            for name in ("run_job", "run_job_gpu", "run_job_gpu1")
        ]
    finally:
        app.stop(warn=pytest.fail)
    assert [f.gpus for f in functions] == [
        [""],
        ["A100-80GB:1"],
        ["H100:1", "A100-80GB:1"],
    ]
    for f in functions:
        assert {d.startup_timeout_secs for d in f.definitions} == {240}, f.name
        assert {d.timeout_secs for d in f.definitions} == {3600}, f.name
    assert modal_server.state.apps[app_id].state_name == "APP_STATE_STOPPED"


_CREDENTIAL_ENV = ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET", *OAUTH_SETTINGS.values())


@pytest.mark.parametrize(
    "given, problem",
    [
        ({"MODAL_TOKEN_ID": "ak-1", "MODAL_TOKEN_SECRET": "as-1"}, None),
        (
            {
                "MODAL_OAUTH_REFRESH_TOKEN": "r",
                "MODAL_OAUTH_CLIENT_ID": "c",
                "MODAL_OAUTH_CLIENT_SECRET": "s",
            },
            None,
        ),
        (
            {
                "MODAL_OAUTH_REFRESH_TOKEN": "r",
                "MODAL_OAUTH_CLIENT_ID": "c",
                "MODAL_OAUTH_JWT_KEY": "k",
            },
            None,
        ),
        (
            {
                "MODAL_OAUTH_REFRESH_TOKEN": "r",
                "MODAL_OAUTH_CLIENT_ID": "c",
                "MODAL_OAUTH_CLIENT_SECRET": "s",
                "MODAL_OAUTH_JWT_KEY": "k",
            },
            "Modal OAuth credentials: MODAL_OAUTH_CLIENT_SECRET and "
            "MODAL_OAUTH_JWT_KEY are both set, and Modal takes exactly one",
        ),
        (
            {"MODAL_OAUTH_REFRESH_TOKEN": "r"},
            "Modal OAuth credentials are incomplete: MODAL_OAUTH_CLIENT_ID, "
            "MODAL_OAUTH_CLIENT_SECRET or MODAL_OAUTH_JWT_KEY unset",
        ),
        (
            {"MODAL_TOKEN_ID": "ak-1", "MODAL_OAUTH_CLIENT_ID": "c"},
            "Modal credentials: a token",
        ),
        ({}, "no Modal credentials: run `modal token new`"),
    ],
)
def test_credentials_as_the_real_client_reads_them(
    real_client, monkeypatch, tmp_path, given, problem
):
    """Token or OAuth credentials, read by the installed client's ``config.get``
    from the environment (no ``.modal.toml``: MODAL_CONFIG_PATH points nowhere)."""
    import modal.config

    from snakemake_executor_plugin_modal import preflight
    from snakemake_executor_plugin_modal.preflight import credentials_problem

    monkeypatch.setattr(modal.config, "_user_config", {})
    # the JWT key's extra taken as installed (a module every Python has); without
    # it: test_a_jwt_key_without_modals_oauth_extra_is_named
    monkeypatch.setattr(preflight, "_JWT_MODULES", ("json",))
    for name in _CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    found = credentials_problem()
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_a_jwt_key_without_modals_oauth_extra_is_named(real_client, monkeypatch):
    """A private-key OAuth set needs what the installed client imports for it
    (``OAuthAssertionProvider``, modal/_utils/oauth.py: modal's ``oauth`` extra);
    where one is missing the preflight says so and how to install it."""
    import modal._utils.oauth
    import modal.config

    from snakemake_executor_plugin_modal import preflight

    source = inspect.getsource(modal._utils.oauth.OAuthAssertionProvider.__init__)
    for module in preflight._JWT_MODULES:
        assert re.search(rf"^\s*(import|from) {module}\b", source, re.M), module
    monkeypatch.setattr(modal.config, "_user_config", {})
    for name in _CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MODAL_OAUTH_REFRESH_TOKEN", "r")
    monkeypatch.setenv("MODAL_OAUTH_CLIENT_ID", "c")
    monkeypatch.setenv("MODAL_OAUTH_JWT_KEY", "k")
    monkeypatch.setattr(preflight, "_JWT_MODULES", ("json", "no_such_module_x"))
    assert preflight.credentials_problem() == (
        "Modal OAuth credentials: MODAL_OAUTH_JWT_KEY needs modal's 'oauth' extra "
        "(no_such_module_x not installed): pip install 'modal[oauth]'"
    )


def test_the_oauth_settings_are_the_real_clients(real_client):
    """Each OAuth setting the plugin reads is one of the installed client's
    (``modal.config._SETTINGS``), read from the variable it names."""
    import modal.config

    for name, env in OAUTH_SETTINGS.items():
        assert name in modal.config._SETTINGS, name
        assert env == f"MODAL_{name.upper()}"
