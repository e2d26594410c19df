# References for the figure: the Monte-Carlo noise ceiling (a second estimate of the
# first `noise_ceiling_images` images of every configuration, other seeds) and, for the
# demo's synthetic areas, the ground truth (each area's own Fisher information).


use rule estimate_image as estimate_image_ceiling with:
    # The per-image job of rules/estimate.smk, with the estimator seeded with
    # seed + 10**6 + i: a second, independent Monte-Carlo estimate of image i.
    output:
        LAYOUT.ceiling_pattern,
    log:
        LAYOUT.job_log_pattern("estimate_image_ceiling"),
    params:
        estimator=(
            canonical(ceiling_estimator(SCENARIO.estimator))
            if not SCENARIO.settings_per_configuration
            else get_ceiling_estimator
        ),
        diffusion=(
            DIFFUSION_PARAMS
            if not SCENARIO.settings_per_configuration
            else get_diffusion
        ),


# A profile's `set-resources` for estimate_image hold for these jobs too; what Snakemake
# would work out again for each per-image job is worked out once.
hooks.settle_per_image_rules(workflow, "estimate_image_ceiling")


# The noise ceiling, and the shared-draws control of the compared pairs (params.pairs,
# config key shared_draws_control; results/science.py).
rule align_ceiling:
    input:
        first=get_ceiling_files("first"),
        second=get_ceiling_files("second"),
        checked=rules.verify_per_image_files.output[0],  # both estimates are good
    output:
        LAYOUT.noise_ceiling,
    log:
        "logs/align_ceiling.log",
    benchmark:
        "logs/benchmarks/align_ceiling/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        **(
            {"pairs": [list(p) for p in SCENARIO.draws_control_pairs]}
            if SCENARIO.draws_control_pairs
            else {}
        ),
        max_k=SCENARIO.top_k,
    script:
        "../scripts/align_ceiling.py"


rule align_truth:
    input:
        per_image=[f for c in DEMO_CONFIGS for f in SCENARIO.per_image_files(c)],
        truth=get_truth_files(),
        checked=rules.verify_per_image_files.output[0],  # the per-image files are good
    output:
        LAYOUT.truth_metrics,
    log:
        "logs/align_truth.log",
    benchmark:
        "logs/benchmarks/align_truth/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        max_k=SCENARIO.top_k,
    script:
        "../scripts/align_truth.py"


rule plot_ground_truth:
    input:
        truth=rules.align_truth.output[0],
    output:
        png=report(
            LAYOUT.result("ground_truth.png"),
            caption="../report/ground_truth.rst",
            category="Figure",
            labels={"figure": "Ground truth"},
        ),
        pdf=LAYOUT.result("ground_truth.pdf"),
    log:
        "logs/plot_ground_truth.log",
    benchmark:
        "logs/benchmarks/plot_ground_truth/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../scripts/plot_ground_truth.py"
