"""
Submissions that cannot fail halfway: a layer over the ``sbatch`` calls of
``snakemake-executor-plugin-slurm`` (2.8.0) on the login node, in a run with
``--executor slurm``. A shard is one ``sbatch`` (one group job, one allocation).

- **A long shard.** Without its setting ``pass_command_as_script`` the plugin puts
  the shard's whole command on sbatch's command line (``--wrap="..."``, run by
  ``/bin/sh -c``): one ``--target-jobs`` entry per image, about 55 characters each,
  so that a shard of 3,000 images is a line of 165 kB. Linux refuses one argument
  above 128 KiB (MAX_ARG_STRLEN: "Argument list too long"), and a site may refuse
  far less (SLURM 23.02 and later: ``SchedulerParameters=max_submit_line_size``,
  sbatch then answers "Pathname of a file, directory or other parameter too long":
  plugin issue #379). profiles/slurm sets ``slurm-pass-command-as-script: true``
  (the command fed to sbatch as a script on its standard input: a short command
  line whatever the shard); a submission refused for its length without it is made
  once more in that form (`as_script`), with one line.
- **A lost reply.** sbatch may report a failure for a submission that SLURM accepted
  ("Socket timed out on send/recv operation": the controller's reply did not come in
  time; nextflow #970, plugin #313). The plugin then reports the shard failed and
  Snakemake submits it again (``retries``) beside the first. After a failed sbatch,
  and before every submission, the layer looks for a job of this run (the plugin's
  ``--job-name``: the run's id) with the shard's ``--comment`` (its group and rules)
  that SLURM queues or runs (``squeue``), and hands the plugin that job's id instead
  (`Submissions.submit`), with one line. One that appears only after its shard was
  submitted again is cancelled by the status layer
  (`multigeom_workflow.on_slurm.status`), which reads the ids this layer saw.

The layer stands in for the ``subprocess`` module in the plugin's namespace (its
``run_job`` calls ``subprocess.Popen(call, shell=True, ...)``); every other use of the
module is the module's own. tests/test_slurm_site.py checks the plugin's source for
what this relies on.
"""

from __future__ import annotations

import errno
import re
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from ..settings.slurm_states import WILL_RUN, word

__all__ = [
    "LOST_REPLY_WAITS",
    "WILL_RUN",
    "Submissions",
    "as_script",
    "install",
    "live_jobs_named",
    "submission_key",
]

#: Seconds to wait before each look for a job whose sbatch reported a failure: the
#: controller may register a submission whose reply timed out a little later.
LOST_REPLY_WAITS = (0.0, 2.0, 4.0)


def submission_key(call: str) -> tuple[str, str] | None:
    """
    The job name and comment of one of the plugin's sbatch submissions (``sbatch
    --parsable --job-name <run id> ... --comment <rule_group_rules> ...``: its
    ``submit_string.get_submit_command``); None for any other command (``sbatch
    --test-only``, an array submission, a call without them).
    """
    head = call.split(' --wrap="', 1)[0]  # the shard's command, if there, is last
    try:
        words = shlex.split(head)
    except ValueError:
        return None
    if not words or words[0] != "sbatch" or "--test-only" in words:
        return None
    if any(w.startswith(("--array", "-a")) for w in words):
        return None
    given = dict(zip(words, words[1:], strict=False))
    name, comment = given.get("--job-name"), given.get("--comment")
    return (name, comment) if name and comment else None


def as_script(call: str) -> tuple[str, str] | None:
    """
    The plugin's ``--wrap`` submission in the form of its ``pass_command_as_script``
    setting: the same call ending in `` /dev/stdin`` instead of ``--wrap="..."``, and
    the script fed to it, ``#!/bin/sh`` and the shard's command (the plugin's
    ``run_job``: the command with a backslash before each ``"`` inside the wrap; the
    script has it as it was). None when the call does not end in a ``--wrap``.
    """
    head, sep, wrapped = call.partition(' --wrap="')
    if not sep or not wrapped.endswith('"'):
        return None
    command = wrapped[:-1].replace('\\"', '"')
    return head + " /dev/stdin", "\n".join(["#!/bin/sh", command])


def live_jobs_named(name: str) -> list[tuple[str, str, str]] | None:
    """
    The jobs named `name` that SLURM queues or runs (``squeue --name``): (id, state,
    comment) each; None when squeue could not answer.
    """
    try:
        out = subprocess.run(
            ["squeue", "-h", "--name", name, "-o", "%i|%T|%k"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    rows = [line.split("|", 2) for line in out.stdout.splitlines()]
    return [(r[0].strip(), r[1], r[2]) for r in rows if len(r) == 3]


def _too_long(err: str, failure: OSError | None) -> str | None:
    """Why a submission was refused for its length, or None."""
    if failure is not None and failure.errno == errno.E2BIG:
        return f"this machine: {failure.strerror}"
    lines = [x for x in err.splitlines() if "too long" in x.lower()]
    return f"the cluster: {lines[-1].strip()}" if lines else None


def _snakemake_warning(line: str) -> None:
    from .. import snakemake_adapter

    snakemake_adapter.warn(line)


class _Submission:
    """What ``Popen`` gives for a submission: ``communicate`` submits."""

    def __init__(self, layer: Submissions, call: str, key: tuple[str, str], kwargs):
        self.layer, self.call, self.key, self.kwargs = layer, call, key, kwargs
        self.returncode: int | None = None

    def communicate(self, input=None, timeout=None):  # noqa: A002 (Popen's names)
        out, err, self.returncode = self.layer.submit(
            self.call, self.key, input, self.kwargs
        )
        return out, err


class Submissions:
    """
    The ``subprocess`` module as the plugin's module sees it: ``Popen`` of one of
    its sbatch submissions (`submission_key`) submits in a form the cluster accepts
    and finds a submission whose reply was lost (see the module); any other call and
    name is the module's.

    Parameters
    ----------
    popen : callable, optional
        ``subprocess.Popen`` (default).
    jobs_named : callable, optional
        A job name -> the (id, state, comment) of the jobs of that name SLURM queues
        or runs, None when it could not answer (default `live_jobs_named`).
    say : callable, optional
        Writes a line (default: Snakemake's logger, as a warning).
    sleep : callable, optional
        ``time.sleep`` (default).
    waits : sequence of float, optional
        Seconds before each look for a job whose sbatch failed (`LOST_REPLY_WAITS`).
    """

    def __init__(
        self,
        popen: Callable = subprocess.Popen,
        jobs_named: Callable[[str], list | None] = live_jobs_named,
        say: Callable[[str], None] = _snakemake_warning,
        sleep: Callable[[float], None] = time.sleep,
        waits: Sequence[float] = LOST_REPLY_WAITS,
    ):
        self.popen, self.jobs_named, self.say = popen, jobs_named, say
        self.sleep, self.waits = sleep, waits
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._said_script = False

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def Popen(self, args, *more, **kwargs):  # noqa: N802 (the module's name)
        """``subprocess.Popen``; for a submission of the plugin's, one that submits
        when its ``communicate`` is called (`submit`).
        """
        key = submission_key(args) if isinstance(args, str) and not more else None
        if key is None or not kwargs.get("shell"):
            return self.popen(args, *more, **kwargs)
        return _Submission(self, args, key, kwargs)

    def submitted_ids(self) -> set[str]:
        """The job ids that this run's submissions gave (or found), so far."""
        with self._lock:
            return set(self._ids)

    def submit(
        self, call: str, key: tuple[str, str], script: str | None, kwargs: dict
    ) -> tuple[str, str, int]:
        """
        Submit one shard as the plugin would (`call`, `script` on sbatch's standard
        input, ``Popen``'s `kwargs`), unless SLURM already queues or runs a job of
        this run with its comment (`key`: job name, comment): that job's id instead.
        A submission refused for its length is made once more with its command as a
        script (`as_script`); after a failed one, such a job is looked for again
        (`waits`).

        Returns
        -------
        out, err : str
            What sbatch wrote (the job's id: ``--parsable``), or the found job's id.
        returncode : int

        Raises
        ------
        OSError
            Where the command could not be started, even as a script.
        """
        found = self._orphan(key, (0.0,))
        if found:
            self.say(
                f"SLURM already queues or runs allocation {found} of this run for the "
                f"shard of comment {key[1]} (an earlier sbatch reported a failure "
                "that SLURM had accepted): tracked as that shard instead of "
                "submitting it again"
            )
            return f"{found}\n", "", 0
        out, err, code, failure = self._run(call, script, kwargs)
        why = _too_long(err, failure) if code != 0 else None
        form = as_script(call) if why else None
        if form is not None:
            with self._lock:
                say, self._said_script = not self._said_script, True
            if say:
                self.say(
                    f"a shard's submission is longer than {why}: submitted with "
                    "its command as a script on sbatch's standard input instead "
                    "(set `slurm-pass-command-as-script: true` in the profile, as "
                    "profiles/slurm does, to submit every shard so)"
                )
            out, err, code, failure = self._run(*form, kwargs)
        if code != 0:
            found = self._orphan(key, self.waits)
            if found:
                said = (err or "").strip().splitlines() or [str(failure)]
                self.say(
                    f"sbatch reported a failure ({said[-1].strip()}) for the shard of "
                    f"comment {key[1]}, but SLURM had accepted it: allocation {found} "
                    "is that shard's, tracked; no second one is submitted"
                )
                return f"{found}\n", "", 0
            if failure is not None:
                raise failure
            return out, err, code
        match = re.match(r"\s*(\d+)", out or "")
        if match:
            with self._lock:
                self._ids.add(match.group(1))
        return out, err, code

    def _run(self, call, script, kwargs):
        """`call` run as the plugin runs it: stdout, stderr, exit status (None where
        it could not start) and the error that kept it from starting.
        """
        try:
            proc = self.popen(call, **kwargs)
        except OSError as failure:
            return "", "", None, failure
        out, err = proc.communicate(input=script)
        return out, err, proc.returncode, None

    def _orphan(self, key: tuple[str, str], waits: Sequence[float]) -> str | None:
        """The id of a job with this run's name and the shard's comment that SLURM
        runs or will run (`WILL_RUN`) and that no submission handed the plugin yet
        (one it had is one it ended: a retry is not it), the oldest, looked for after
        each of `waits`; None if none.
        """
        name, comment = key
        for wait in waits:
            if wait:
                self.sleep(wait)
            jobs = self.jobs_named(name) or []
            handed = self.submitted_ids()
            ids = sorted(
                (int(job), job)
                for job, state, given in jobs
                if job.isdigit()
                and job not in handed
                and given == comment
                and word(state) in WILL_RUN
            )
            if ids:
                with self._lock:
                    self._ids.add(ids[0][1])
                return ids[0][1]
        return None


def install() -> Submissions | None:
    """
    Put `Submissions` in place of the ``subprocess`` module in the plugin's module
    (``snakemake_executor_plugin_slurm``, whose ``Executor.run_job`` submits with
    ``subprocess.Popen``), through the adapter's check of that part
    (`multigeom_workflow.snakemake_adapter.replace_in_slurm_plugin`); once per
    process. None when the part is not what the layer was written for (one line).
    """
    import snakemake_executor_plugin_slurm as plugin

    from .. import snakemake_adapter as adapter

    if isinstance(plugin.subprocess, Submissions):
        return plugin.subprocess
    return adapter.replace_in_slurm_plugin(
        "subprocess",
        lambda module: Submissions(),
        "the plugin submits as it does: a submission whose reply was lost may run "
        "beside its retry",
    )
