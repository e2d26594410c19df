"""
Modal's OAuth settings (``MODAL_OAUTH_*``) instead of a token, through the installed
client against the local Modal server: a run that reaches Modal with them, and one
that Modal refuses, named for the credentials given.
"""

from __future__ import annotations

from modal_proto import api_pb2

from .helpers import COPY, run_snakemake, spawned


def oauth_env(server, monkeypatch, **changed: str) -> None:
    """Give this process (and the Snakemake it starts) the server's OAuth settings in
    place of its token (``client_env(oauth=True)``); `changed` overrides some."""
    env = server.client_env(heartbeat_interval_s=1.0, oauth=True)
    for name in ("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"):
        assert name not in env
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, **changed}.items():
        monkeypatch.setenv(name, value)


def client_calls(server) -> list:
    """The RPCs the local Modal server took from a client (not a container)."""
    with server.state.lock:
        return [
            c
            for c in server.state.calls
            if c.metadata.get("x-modal-client-type") == str(api_pb2.CLIENT_TYPE_CLIENT)
        ]


def test_a_run_given_oauth_credentials_reaches_modal_with_them(
    modal_server, tmp_path, monkeypatch
):
    """Every call the run's client makes carries the OAuth client id (the refresh
    token and client secret are checked by the server and not recorded), none a
    token; the job runs and its output comes home."""
    oauth_env(modal_server, monkeypatch)
    (tmp_path / "in.txt").write_text("payload\n")
    result = run_snakemake(tmp_path, COPY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "out.txt").read_text() == "payload\n"
    assert [c["status"] for c in spawned(modal_server)] == ["GENERIC_STATUS_SUCCESS"]
    calls = client_calls(modal_server)
    methods = {c.method for c in calls}
    assert {"AppCreate", "FunctionCreate", "FunctionMap"} <= methods, methods
    assert {c.metadata.get("x-modal-oauth-client-id") for c in calls} == {
        "oc-local-test"
    }
    assert not [c for c in calls if "x-modal-token-id" in c.metadata]


def test_oauth_credentials_modal_refuses_are_named_as_such(
    modal_server, tmp_path, monkeypatch
):
    """A client secret the server refuses (UNAUTHENTICATED, the client's
    ``AuthError``) ends the run in one line naming the OAuth settings, not the token;
    nothing is spawned."""
    oauth_env(modal_server, monkeypatch, MODAL_OAUTH_CLIENT_SECRET="os-revoked")
    (tmp_path / "in.txt").write_text("payload\n")
    result = run_snakemake(tmp_path, COPY)
    assert result.returncode != 0
    lines = [
        line
        for line in result.stderr.splitlines()
        if "Modal refused the credentials" in line
    ]
    assert len(lines) == 1, result.stderr[-3000:]
    assert (
        "the OAuth credentials (MODAL_OAUTH_*) are wrong, revoked or expired"
        in (lines[0])
    )
    assert "modal token new" not in lines[0]
    assert spawned(modal_server) == []
    assert not (tmp_path / "out.txt").exists()


def test_no_credential_of_modal_reaches_a_job_whatever_envvars_says():
    """Modal's token and its OAuth settings (a refresh token, a client secret, a JWT
    key: modal/config.py) are left out of the secret the containers get, even when
    named in ``--envvars``; another variable named there is passed."""
    from snakemake_executor_plugin_modal import SECRET_ENVVARS, Executor

    named = {
        "MODAL_TOKEN_ID": "ak-1",
        "MODAL_TOKEN_SECRET": "as-1",
        "MODAL_OAUTH_REFRESH_TOKEN": "rt",
        "MODAL_OAUTH_CLIENT_ID": "ci",
        "MODAL_OAUTH_CLIENT_SECRET": "cs",
        "MODAL_OAUTH_JWT_KEY": "jk",
        "MY_SETTING": "kept",
    }
    ex = Executor.__new__(Executor)
    ex.envvars = lambda: dict(named)
    assert set(SECRET_ENVVARS) == set(named) - {"MY_SETTING"}
    assert ex.job_env() == {"MY_SETTING": "kept"}
