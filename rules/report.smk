# The run's tables for its Snakemake report (`snakemake --report report.html`): Stage
# 5's metrics, per-configuration progress and seconds per image (each per-image file's
# elapsed_seconds, as the check's list records them: no file is read again), and the
# settings of the run. Captions: report/*.rst.


rule summarize_run:
    input:
        metrics=rules.align_configs.output[0],
        checked=rules.verify_per_image_files.output[0],  # the per-image files
    output:
        metrics=report(
            LAYOUT.result("report/stage5_metrics.html"),
            caption="../report/stage5_metrics.rst",
            category="Stage 5",
            labels={"table": "alignment A_k per pair"},
        ),
        metrics_csv=LAYOUT.result("report/stage5_metrics.csv"),
        progress=report(
            LAYOUT.result("report/progress.html"),
            caption="../report/progress.rst",
            category="Run",
            labels={"table": "progress and seconds per image"},
        ),
        settings=report(
            LAYOUT.result("report/settings.html"),
            caption="../report/settings.rst",
            category="Run",
            labels={"table": "settings"},
        ),
    log:
        "logs/summarize_run.log",
    localrule: True
    conda:
        CONDA_ENV
    params:
        configurations=[[c.encoder, c.area] for c in SCENARIO.configurations],
        # the run's settings files, and those of configurations with their own
        settings_files=canonical(
            {
                "estimator": str(SCENARIO.estimator_file),
                "diffusion": str(SCENARIO.diffusion_file),
                **{
                    f"configs[{i}].{key}": str(getattr(c, f"{key}_file"))
                    for i, c in enumerate(SCENARIO.configurations)
                    for key in ("estimator", "diffusion")
                    if key in c.own
                },
            }
        ),
    script:
        "../scripts/summarize_run.py"
