# Stage 5: upstream's alignment between every pair of the run's configurations, over
# their first n_images images, once every per-image file is checked.


rule verify_per_image_files:
    input:
        get_checked_files,
    output:
        LAYOUT.per_image_checked,
    log:
        "logs/verify_per_image_files.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        expected=get_expected_per_image(),
        image_files=SCENARIO.test_image_files[: SCENARIO.n_images],
        # the list's form: a list of another form is written again (verify.py)
        list_columns=CHECKED_LIST_COLUMNS,
    script:
        "../scripts/verify_per_image_files.py"


# Stage 5 reads the per-image files from the check's list (its only input): the files
# the check found good, and one input instead of every per-image file (each input of
# each rule costs Snakemake time per file when it plans; rule all lists them).
rule align_configs:
    input:
        checked=rules.verify_per_image_files.output[0],
    output:
        report(
            LAYOUT.stage5_metrics,
            caption="../report/metrics_json.rst",
            category="Stage 5",
            labels={"table": "metrics file (JSON)"},
        ),
    log:
        "logs/align_configs.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        max_k=SCENARIO.top_k,
        n_images=SCENARIO.n_images,
    script:
        "../scripts/align_configs.py"
