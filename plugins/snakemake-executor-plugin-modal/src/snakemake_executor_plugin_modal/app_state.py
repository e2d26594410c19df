"""
What Modal says of the run's app: stopped or running (`app_stopped`), asked when a
call ended without a cancel from the run and without an exception of the
container's, which is what both a stopped app's calls and a lost container's call
raise (`calls.ContainerCall.poll`): only Modal's answer tells them apart.
"""

from __future__ import annotations

__all__ = ["ENDED_STATES", "app_stopped"]

#: The states of ``modal.types.AppState`` (modal/types.py, modal 1.6.4) in which an
#: app runs no more calls: stopped, being stopped (``APP_STATE_STOPPING``), or
#: disabled (a deployed app's; never this run's ephemeral one).
ENDED_STATES = ("stopped", "stopping", "disabled")


def app_stopped(app) -> bool:
    """
    Whether Modal says the app has ended, asked now.

    Parameters
    ----------
    app : modal.App
        The run's app, running (it has an id: ``App.app_id``).

    Returns
    -------
    bool
        True where its state is one of :data:`ENDED_STATES`, or where Modal no
        longer knows the app (``NotFoundError``); False while it runs (ephemeral,
        detached, deployed).

    Raises
    ------
    Exception
        What the client raises where the state cannot be read (a transport error,
        ``errors.unreadable_errors``; a token revoked meanwhile, ``AuthError``): the
        caller decides.

    Notes
    -----
    Read with ``App.info(refresh=True)`` (modal/app.py, ``_App.info``: one
    ``AppGetInfo`` request, not the answer cached at the app's start), whose
    ``lifecycle.state`` is ``AppLifecycle._from_proto``'s reading of the server's
    ``AppLifecycle.app_state`` (modal/types.py). ``modal app stop`` reads the same
    lifecycle (``AppGetLifecycle``, ``resolve_app_identifier``, modal/cli/app.py).
    """
    import modal.exception

    try:
        info = app.info(refresh=True)
    except modal.exception.NotFoundError:
        return True
    return info.lifecycle.state.value in ENDED_STATES
