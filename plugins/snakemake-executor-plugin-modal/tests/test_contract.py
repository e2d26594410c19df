"""
Contract: every Modal name the plugin calls exists in the installed ``modal`` package
with a signature that accepts the plugin's arguments, so that a Modal upgrade that
renames or changes one fails here and not on a user's account. The fake backend is held
to the same contract, so the tests that run on it call what real Modal offers.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import snakemake_executor_plugin_modal

PLUGIN = Path(snakemake_executor_plugin_modal.__file__).parent

# (object path, arguments the plugin passes): bound against the signature.
CALLS = [
    ("App", (), {"name": "x"}),
    (
        "App.function",
        ("self",),
        dict(image=None, gpu="A100", cpu=2.0, timeout=60, volumes={}, serialized=True),
    ),
    ("App.run", ("self",), {}),
    ("Function.spawn", ("self", {"spec": 1}), {}),
    ("FunctionCall.get", ("self",), {"timeout": 0}),
    ("FunctionCall.cancel", ("self",), {"terminate_containers": True}),
    ("Image.debian_slim", (), {"python_version": "3.11"}),
    ("Image.pip_install", ("self", "snakemake==9.0"), {}),
    ("Image.run_commands", ("self", "echo cached"), {}),
    ("Image.add_local_python_source", ("self", "snakemake_executor_plugin_modal"), {}),
    ("Volume.from_name", ("vol",), {"create_if_missing": True}),
    ("Volume.listdir", ("self", "prefix"), {"recursive": True}),
    ("Volume.read_file", ("self", "prefix/a.txt"), {}),
    ("Volume.batch_upload", ("self",), {"force": True}),
    ("Volume.commit", ("self",), {}),
    ("config.config.get", ("token_id",), {}),
]
ATTRIBUTES = [
    "FunctionCall.object_id",
    "exception.TimeoutError",
    "exception.FunctionTimeoutError",
    "exception.NotFoundError",
    "volume.FileEntryType.FILE",
]


def real_modal():
    import importlib

    import modal

    if "fake" in modal.__version__:  # a test left the fake in place
        pytest.skip("the fake modal is imported in this process")
    for sub in ("exception", "volume", "config"):
        importlib.import_module(f"modal.{sub}")
    return modal


@pytest.fixture(params=["modal", "fake"])
def backend(request):
    if request.param == "modal":
        return real_modal()
    return request.getfixturevalue("fake_modal")


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


def test_poll_takes_pythons_timeout_error_as_running():
    from snakemake_executor_plugin_modal.calls import ContainerCall

    class Running:
        def get(self, timeout=None):
            raise TimeoutError()

    call = ContainerCall.__new__(ContainerCall)
    call.call, call.timeout_s, call._run = Running(), 60, None
    assert call.poll() is None


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


def test_every_modal_name_in_the_plugin_is_in_the_contract():
    """A new Modal name read by the plugin must be added to this contract."""
    covered = {part for n, _, _ in CALLS for part in n.split(".")}
    covered |= {part for a in ATTRIBUTES for part in a.split(".")}
    used = set()
    for f in PLUGIN.glob("*.py"):
        used |= modal_names(ast.parse(f.read_text()))
    assert used, "no Modal name found: the check is broken"
    assert used <= covered, used - covered
