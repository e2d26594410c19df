# The per-image target: G(x) and J(x) of one test image of one (encoder, area)
# configuration, computed by the configured engine (upstream's multigeom.pipeline.per_image, or the
# fast engine) and written in upstream's format.
# The settings are params (a change of their content recomputes); the device is not
# (the same image gives the same result wherever it runs). The job is a light process
# (multigeom_workflow.compute.client, no torch) that holds a slot and hands its request
# to the slot's warm worker; what all jobs share comes resolved in MULTIGEOM_RUN
# (multigeom_workflow.on_snakemake.start).

import shlex
import sys

# The per-image job's command, for any rule with the inputs (image, encoder,
# diffusion), output, log and threads of estimate_image; the output's path names the
# rule, the configuration and the image (settings.layout). Few, short fields: Snakemake
# formats it several times per job, in dry runs too. The params are Snakemake's record
# of the settings (a change recomputes); the job reads the same settings, by its rule
# and configuration, from the run's (multigeom_workflow.compute.request.RunSettings).
ESTIMATE_IMAGE_SHELL = (
    f"{shlex.quote(sys.executable)} -m multigeom_workflow.compute.client"
    " --input {input:q} --output {output:q} --threads {threads} > {log:q} 2>&1"
)


rule estimate_image:
    input:
        unpack(get_estimate_inputs),
    output:
        LAYOUT.per_image_pattern,
    log:
        LAYOUT.job_log_pattern("estimate_image"),
    group:
        get_shard if RUN.sharded else None
    conda:
        CONDA_ENV
    threads: 1
    resources:
        **hooks.estimate_resources(RUN),
    params:
        # the configuration's settings and seed (config keys configs[i].estimator,
        # .diffusion, .sigma, monte_carlo_seeds; all alike: one dict for all, no
        # function to call per job)
        estimator=ESTIMATOR_PARAMS if ONE_ESTIMATOR else get_estimator,
        diffusion=DIFFUSION_PARAMS if ONE_ESTIMATOR else get_diffusion,
    shell:
        ESTIMATE_IMAGE_SHELL
