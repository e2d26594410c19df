# Stage 5: upstream's alignment between every pair of the run's configurations, over
# their first n_images images.


rule align_configs:
    localrule: True
    input:
        get_per_image_files,
    output:
        report(
            f"{RUNS}/metrics/cross_encoder_metrics.json",
            caption="../report/metrics_json.rst",
            category="Stage 5",
            labels={"table": "metrics file (JSON)"},
        ),
    params:
        max_k=SCENARIO.top_k,
    log:
        "logs/align_configs.log",
    script:
        "../scripts/align_configs.py"
