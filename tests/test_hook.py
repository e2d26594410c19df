"""
The hook through which a test or a benchmark puts an estimator in place of the real
one (`multigeom_workflow.compute.hook`): unset, nothing is reached; a bad value is
named with what is allowed; the stand-in serves as one.
"""

from __future__ import annotations

import json

import pytest

from multigeom_workflow.compute import hook, standin
from multigeom_workflow.compute.request import EstimateRequest


def test_unset_means_the_real_estimator(monkeypatch):
    monkeypatch.delenv(hook.HOOK_ENV, raising=False)
    assert hook.estimator_hook() is None
    hook.record(what="job")  # nothing to hand it to: no error, no file


@pytest.mark.parametrize(
    ("value", "why"),
    [("no_such_module_xyz", "cannot be imported"), ("json", "no estimate or record")],
)
def test_a_bad_hook_is_named(monkeypatch, value, why):
    monkeypatch.setenv(hook.HOOK_ENV, value)
    with pytest.raises(RuntimeError, match=rf"{hook.HOOK_ENV} = '{value}'.*{why}") as e:
        hook.estimator_hook()
    assert "allowed: unset" in str(e.value)


def test_the_stand_in_is_a_hook(monkeypatch, tmp_path):
    _, env = standin.simulated_scenario(tmp_path / "sim", 1, 1)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    records = tmp_path / "records.jsonl"
    monkeypatch.setenv(standin.RECORD_ENV, str(records))
    monkeypatch.delenv(standin.STANDIN_ENV, raising=False)
    assert hook.estimator_hook() is standin
    out = tmp_path / "per_image" / "onoff" / "V1" / "img0002.pt"
    request = EstimateRequest(
        image=str(tmp_path / "im00002.png"),
        index=2,
        out=str(out),
        estimator={"seed": 7},
        encoder_name="onoff",
        area="V1",
        encoder_ckpt="e.pt",
        diffusion_ckpt="d.pt",
        diffusion={},
    )
    hook.estimator_hook().estimate(request, "gpu0")
    hook.record(what="job", out=str(out), end=1.0)
    identity = json.loads(out.read_text())
    assert (identity["index"], identity["seed"], identity["area"]) == (2, 7, "V1")
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert [(e["what"], e["end"] is None) for e in lines] == [
        ("compute", True),
        ("compute", False),
        ("job", False),
    ]
