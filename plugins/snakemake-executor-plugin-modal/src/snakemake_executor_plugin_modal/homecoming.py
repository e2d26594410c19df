"""
Bringing files home: a finished job's outputs, logs and benchmarks after success,
its logs after a failure (`Homecoming.fetch_results`), and, once Snakemake has
handled a failed job, the outputs its container finished and committed
(`Homecoming.bring_home_failed`), so that a retry or the next run computes only the
rest. The budget is checked while files download.

A finished job's files that came home verified leave the volume
(`VolumeStager.prune`; not with ``--modal-keep-on-volume``): its outputs, their
reuse markers, its logs, benchmarks and container log. A failed job's stay: its
retry and the next run reuse what its container finished. The jobs of one status
round read one listing of the volume (`staging.Listing`).
"""

from __future__ import annotations

from .staging import relative_to_workdir

__all__ = ["Homecoming"]


class Homecoming:
    """
    The executor's downloads (a part of ``Executor``).

    Reads the executor's state made in ``Executor.__post_init__``: ``stager``,
    ``workdir``; the failed jobs' specs (``_failed``, set by `Status`).
    """

    def fetch_results(self, job_info, ok: bool, listing=None) -> None:
        """
        Download a finished job's files: after success its outputs (all required),
        logs, benchmarks and container log, then prune them from the volume (once
        home and verified, before Snakemake hears of the success: no job that reads
        them is submitted before, so none finds them gone); after a failure its
        logs only (Snakemake deletes a failed job's outputs anyway), which stay.

        Parameters
        ----------
        job_info : SubmittedJobInfo
        ok : bool
            Whether the job succeeded.
        listing : staging.Listing, optional
            The status round's listing of the volume, shared by its jobs.
        """
        spec = job_info.aux["spec"]
        ticks = {**self._download_ticks(), "listing": listing}
        if ok:
            home = self.stager.download(spec["job_outputs"], **ticks)
            others = {rel for rel, _ in spec["outputs"]} - set(spec["job_outputs"])
            home += self.stager.download(
                [*sorted(others), *spec["results"], spec["log"]],
                missing_ok=True,
                **ticks,
            )
            if not self.settings.keep_on_volume:
                self.stager.prune(home, listing)
        else:
            logs = [relative_to_workdir(f, self.workdir) for f in job_info.job.log]
            self.stager.download([*logs, spec["log"]], missing_ok=True, **ticks)

    def _download_ticks(self) -> dict:
        """`VolumeStager.download`'s ``tick`` and ``tick_s``: the budget check
        (`Cancellation.check_budget`), every status interval while files
        download."""
        interval = self.next_seconds_between_status_checks or 10
        return {"tick": self.check_budget, "tick_s": float(interval)}

    def bring_home_failed(self, job) -> None:
        """
        ``handle_job_error``'s work, after Snakemake has handled a failed job
        (removed its outputs, as after any failure): bring home the outputs its
        container finished and committed (the images of a shard that did not fail:
        on the volume with the marker of their job's key), so that its retry and
        the next run compute only the rest. Snakemake calls it after the job's
        cleanup (``_handle_error`` in ``snakemake/scheduling/job_scheduler.py``:
        ``postprocess(error=True)``, then ``handle_job_error``), under its
        scheduler's lock, which holds up the status loop meanwhile: the budget is
        checked while the files download (every status interval).
        """
        spec = self._failed.pop(job, None)
        if spec is None:
            return
        try:
            finished = self.stager.finished(spec.get("members", []))
            if finished:
                self.stager.download(finished, **self._download_ticks())
                self.logger.info(
                    f"Modal: job {self.get_jobname(job)} failed; {len(finished)} "
                    "output(s) its container finished are brought home and kept "
                    "(a retry or the next run computes only the rest)"
                )
        except Exception as e:  # the files stay on the volume; a retry reuses them
            self.logger.warning(
                f"Modal: the finished outputs of failed job {self.get_jobname(job)} "
                f"could not be brought home ({type(e).__name__}: {e}); they stay on "
                "the volume, where a retry reuses them"
            )
