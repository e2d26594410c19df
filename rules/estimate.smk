# The per-image target: G(x) and J(x) of one test image of one (encoder, area)
# configuration, computed and written by upstream's multigeom.pipeline.per_image.
# The settings are params (a change of their content recomputes); the device is not
# (the same image gives the same result wherever it runs).


rule estimate_image:
    input:
        unpack(get_estimate_inputs),
    output:
        f"{RUNS}/per_image/{{encoder}}/{{area}}/img{{index}}.pt",
    params:
        estimator=SCENARIO.estimator,
        diffusion=SCENARIO.diffusion,
    log:
        "logs/estimate_image/{encoder}/{area}/img{index}.log",
    benchmark:
        "benchmarks/estimate_image/{encoder}/{area}/img{index}.tsv"
    group:
        get_shard
    threads: 1
    resources:
        gpu=ESTIMATE_GPUS,
        runtime=ESTIMATE_RUNTIME_MIN,  # minutes, for SLURM only (rules/plan.smk)
    script:
        "../scripts/estimate_image.py"
