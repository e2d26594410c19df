"""
A per-image job as a ``script:`` (for rules that cannot use a ``shell:`` command): the
same job as rule estimate_image's command (`multigeom_workflow.client`), built from the
rule's wildcards, input, output, params (``params.estimator``: the estimator settings)
and threads. Slower to start than the command (Snakemake's script preamble).
"""

from multigeom_workflow.client import main
from multigeom_workflow.jobs import job_log

with job_log(snakemake.log[0]):
    s = snakemake
    main(
        [
            *("--image", s.input.image, "--index", s.wildcards.index),
            *("--out", s.output[0], "--encoder", s.wildcards.encoder),
            *("--area", s.wildcards.area, "--encoder-ckpt", s.input.encoder),
            *("--diffusion-ckpt", s.input.diffusion),
            *("--estimator", repr(s.params.estimator)),
            *("--diffusion", repr(s.params.diffusion)),
            *("--threads", str(s.threads)),
        ]
    )
