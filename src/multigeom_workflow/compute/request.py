"""
What a per-image job asks for, in one typed request that travels as JSON: from the light
job process (`multigeom_workflow.compute.client`) to a warm worker over its socket, to
the same code in the job itself (``workers: cold``), and inside a Modal container (which
runs the same job). Only the standard library is imported here, so the job that hands an
image to a warm worker never imports torch.

The settings every per-image job of a run shares (device, GPU ids, CPU shares, the
settings files for provenance, engine, precision, warm or cold) are resolved once
by the Snakemake process that parses the workflow (`RunSettings`) and handed to its
jobs in the environment variable ``MULTIGEOM_RUN``; a job does not read the
configuration again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields

from ..settings.names import configuration_label

__all__ = ["RUN_ENV", "EstimateRequest", "RunSettings"]

#: The environment variable that carries `RunSettings` to the jobs of a run.
RUN_ENV = "MULTIGEOM_RUN"


@dataclass(frozen=True)
class EstimateRequest:
    """
    One per-image estimate of G(x) and J(x): what to compute, with which models and
    settings, and where to write it.

    Attributes
    ----------
    image : str
        The test image file (absolute path; 64 x 64 grayscale once read).
    index : int
        Its index in the test set: the Monte-Carlo draws are seeded with
        ``estimator["seed"] + index``.
    out : str
        The per-image file to write (absolute path, ``.../img{index:04d}.pt``).
    estimator : dict
        Upstream's estimator settings (``multigeom/configs/estimator.yaml`` layout):
        the rule's ``params.estimator``, as the run's settings give it
        (`RunSettings.estimator_of`).
    encoder_name, area : str
        The configuration, as named in the per-image file.
    encoder_ckpt, diffusion_ckpt : str
        The configuration's checkpoints (absolute paths).
    diffusion : dict
        The diffusion model's settings (the rules' ``params.diffusion``, from the
        run's settings).
    settings_files : dict
        Name (``estimator``, ``diffusion``) -> settings file, for upstream's
        provenance record.
    seed : int
        The seed of the draws, for the provenance record: the run's seed (a
        noise-ceiling estimate: its own), that of `estimator`.
    engine : str
        The estimator's implementation (config key ``engine``: ``"fast"``, the default,
        or ``"upstream"``).
    precision : str
        The arithmetic of the estimate (config key ``precision``; ``"fp32"``).
    architecture : str
        What the configuration's encoder is built from (config key
        ``configs[i].architecture``), checked against the checkpoint when the models
        load (``""``: not checked).
    """

    image: str
    index: int
    out: str
    estimator: dict
    encoder_name: str
    area: str
    encoder_ckpt: str
    diffusion_ckpt: str
    diffusion: dict
    settings_files: dict = field(default_factory=dict)
    seed: int = 42
    engine: str = "fast"
    precision: str = "fp32"
    architecture: str = ""

    def to_json(self) -> str:
        """The request as one line of JSON."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> EstimateRequest:
        """
        The request written by `to_json`.

        Raises
        ------
        ValueError
            If the text is not a JSON object, or a field is missing or unknown.
        """
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"an estimate request is a JSON object, not {data!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fields of an estimate request: {unknown}")
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"incomplete estimate request: {err}") from None

    def model_key(self) -> str:
        """
        What identifies the configuration's loaded models: the checkpoints, their
        modification times (a rewritten checkpoint is loaded again), the diffusion
        settings, engine, precision and the architecture the encoder is checked
        against.
        """
        stamps = [
            os.stat(p).st_mtime_ns for p in (self.encoder_ckpt, self.diffusion_ckpt)
        ]
        return json.dumps(
            [
                self.encoder_ckpt,
                self.diffusion_ckpt,
                stamps,
                self.diffusion,
                self.engine,
                self.precision,
                self.architecture,
            ],
            sort_keys=True,
        )


@dataclass(frozen=True)
class RunSettings:
    """
    What every per-image job of one run shares, resolved once when the workflow is
    parsed.

    Attributes
    ----------
    run_id : str
        The run: the pid of its Snakemake process (warm workers and CPU shares belong
        to it; they end with it).
    device : str
        ``"cpu"``, ``"cuda"`` (any free GPU) or ``"cuda:N"``.
    gpu_ids : list of str
        The visible GPUs (``CUDA_VISIBLE_DEVICES`` or ``nvidia-smi``), when `device` is
        CUDA.
    cpu_slots : int
        Shares of the CPU (per-image jobs at once, ``--cores``), when `device` is cpu.
    warm : bool
        Hand the image to a warm worker (``workers: warm``), else compute in the job.
    settings_files : dict
        Name -> settings file, for upstream's provenance record.
    engine, precision : str
        Config keys ``engine`` and ``precision`` (defaults ``"fast"``, ``"fp32"``).
    estimator : dict
        The run's estimator settings (the estimator file, its ``seed`` the run's).
    seeds : dict
        ``"<rule>/<encoder>/<area>"`` -> the seed of that rule's jobs of that
        configuration (``monte_carlo_seeds``; the noise ceiling's, moved): see
        `estimator_of`.
    diffusion : dict
        The diffusion model's settings (the diffusion file).
    configurations : dict
        ``"<encoder>/<area>"`` -> what is the configuration's own: ``architecture``
        (config key ``configs[i].architecture``, or the known one), and, where it
        has settings of its own (``configs[i].estimator``, ``.diffusion``,
        ``.sigma``), ``estimator`` (without its seed), ``diffusion`` and
        ``settings_files``, which replace the run's above for its jobs.

    Notes
    -----
    The per-image rules' params hold the same estimator and diffusion settings, as
    Snakemake's record of what each file was computed with (a change recomputes);
    the job reads them here, not from its command line, which Snakemake formats
    several times per job, in dry runs too (settings dicts are the slowest fields).
    """

    run_id: str
    device: str
    gpu_ids: list = field(default_factory=list)
    cpu_slots: int = 1
    warm: bool = True
    settings_files: dict = field(default_factory=dict)
    engine: str = "fast"
    precision: str = "fp32"
    estimator: dict = field(default_factory=dict)
    seeds: dict = field(default_factory=dict)
    diffusion: dict = field(default_factory=dict)
    configurations: dict = field(default_factory=dict)

    def _own(self, encoder: str, area: str) -> dict:
        """What `configurations` holds for the configuration (empty if nothing)."""
        return self.configurations.get(configuration_label(encoder, area), {})

    def diffusion_of(self, encoder: str, area: str) -> dict:
        """The configuration's diffusion settings: its own, or the run's."""
        return self._own(encoder, area).get("diffusion", self.diffusion)

    def settings_files_of(self, encoder: str, area: str) -> dict:
        """The configuration's settings files (provenance): its own, or the run's."""
        return self._own(encoder, area).get("settings_files", self.settings_files)

    def architecture_of(self, encoder: str, area: str) -> str:
        """The configuration's architecture (``""`` if the run does not say)."""
        return self._own(encoder, area).get("architecture", "")

    def estimator_of(self, rule: str, encoder: str, area: str) -> dict:
        """
        The estimator settings of `rule`'s jobs of the configuration (`encoder`,
        `area`): its own or the run's, with that configuration's seed (``seeds``) —
        the same dict as the rule's ``params.estimator``.

        Raises
        ------
        RuntimeError
            If the run has no seed for them (a rule or configuration it does not
            have), naming the key.
        """
        key = f"{rule}/{encoder}/{area}"
        if key not in self.seeds:
            raise RuntimeError(
                f"the run ({RUN_ENV}) has no estimator settings for {key!r}: allowed: "
                f"{', '.join(sorted(self.seeds)) or 'none'}"
            )
        own = self._own(encoder, area).get("estimator", self.estimator)
        return {**own, "seed": self.seeds[key]}

    def to_env(self) -> dict[str, str]:
        """The environment variable that hands these settings to the run's jobs."""
        return {RUN_ENV: json.dumps(asdict(self), separators=(",", ":"))}

    @classmethod
    def from_env(cls, environ=os.environ) -> RunSettings:
        """
        The settings of the run that started this job.

        Raises
        ------
        RuntimeError
            If ``MULTIGEOM_RUN`` is not set (the job was not started by the workflow).
        """
        text = environ.get(RUN_ENV)
        if not text:
            raise RuntimeError(
                f"{RUN_ENV} is not set: per-image jobs are started by the workflow's "
                "Snakefile (multigeom_workflow.on_snakemake.start sets it)"
            )
        return cls(**json.loads(text))
