"""
A per-image job as a ``script:`` (for rules that cannot use a ``shell:`` command): the
same job as rule estimate_image's command (`multigeom_workflow.compute.client`), built
from the rule's wildcards, input, output, params (``params.estimator``: the estimator
settings) and threads. Slower to start than the command (Snakemake's script preamble).
"""

from multigeom_workflow.compute.client import main
from multigeom_workflow.jobs import job_log

with job_log(snakemake.log[0]):
    s = snakemake
    main(
        [
            "--wildcards",
            ",".join(f"{k}={v}" for k, v in s.wildcards.items()),
            *("--input", s.input.image, s.input.encoder, s.input.diffusion),
            *("--output", s.output[0], "--threads", str(s.threads)),
            *("--params", repr(s.params.estimator), repr(s.params.diffusion)),
        ]
    )
