# Stage 5: upstream's alignment between every pair of the run's configurations, over
# their first n_images images.


rule align_configs:
    localrule: True
    input:
        get_per_image_files,
    output:
        f"{RUNS}/metrics/cross_encoder_metrics.json",
    params:
        max_k=SCENARIO.top_k,
    log:
        "logs/align_configs.log",
    script:
        "../scripts/align_configs.py"
