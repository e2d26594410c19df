# References for the figure: the Monte-Carlo noise ceiling (a second estimate of the
# first `noise_ceiling_images` images of every configuration, other seeds) and, for the
# demo's synthetic areas, the ground truth (each area's own Fisher information).

from multigeom_workflow.science import ceiling_estimator

CEILING_IMAGES = int(config["noise_ceiling_images"])
if CEILING_IMAGES > SCENARIO.n_images:
    sys.exit(
        f"config error: config key 'noise_ceiling_images' = {CEILING_IMAGES}: at most "
        f"n_images ({SCENARIO.n_images}); the ceiling compares images of the run"
    )
DEMO_CONFIGS = [c for c in SCENARIO.configurations if c.is_demo]


def get_ceiling_files(kind):
    """The run's first estimates (`first`) or the second ones (`second`) compared."""
    folder = "per_image" if kind == "first" else "per_image_ceiling"
    return [
        f"{RUNS}/{folder}/{c.encoder}/{c.area}/img{i:04d}.pt"
        for c in SCENARIO.configurations
        for i in range(CEILING_IMAGES)
    ]


def get_truth_files():
    """The ground-truth files of the demo areas of the run, first n_images images."""
    areas = dict.fromkeys(c.area for c in DEMO_CONFIGS)
    return [
        f"{RUNS}/ground_truth/{a}/img{i:04d}.pt"
        for a in areas
        for i in range(SCENARIO.n_images)
    ]


def get_science_outputs():
    """The reference targets of the run (added to rule all's)."""
    out = []
    if CEILING_IMAGES:
        out.append(f"{RUNS}/metrics/noise_ceiling.json")
    if DEMO_CONFIGS:
        out += [
            f"{RUNS}/diffusion/{c.encoder}/{c.area}/conditioning.json"
            for c in DEMO_CONFIGS
        ]
        out += [f"{RESULTS}/ground_truth.png", f"{RESULTS}/ground_truth.pdf"]
    return out


rule estimate_image_ceiling:
    # The per-image job of rules/estimate.smk, with the estimator seeded with
    # seed + 10**6 + i: a second, independent Monte-Carlo estimate of image i.
    input:
        unpack(get_estimate_inputs),
    output:
        f"{RUNS}/per_image_ceiling/{{encoder}}/{{area}}/img{{index}}.pt",
    params:
        estimator=ceiling_estimator(SCENARIO.estimator),
        diffusion=SCENARIO.diffusion,
    log:
        "logs/estimate_image_ceiling/{encoder}/{area}/img{index}.log",
    benchmark:
        "benchmarks/estimate_image_ceiling/{encoder}/{area}/img{index}.tsv"
    group:
        get_shard
    threads: 1
    resources:
        gpu=ESTIMATE_GPUS,
    script:
        "../scripts/estimate_image.py"


rule align_ceiling:
    localrule: True
    input:
        first=get_ceiling_files("first"),
        second=get_ceiling_files("second"),
    output:
        f"{RUNS}/metrics/noise_ceiling.json",
    params:
        max_k=SCENARIO.top_k,
    log:
        "logs/align_ceiling.log",
    script:
        "../scripts/align_ceiling.py"


rule align_truth:
    localrule: True
    input:
        per_image=[f for c in DEMO_CONFIGS for f in SCENARIO.per_image_files(c)],
        truth=get_truth_files(),
    output:
        f"{RUNS}/metrics/ground_truth.json",
    params:
        max_k=SCENARIO.top_k,
    log:
        "logs/align_truth.log",
    script:
        "../scripts/align_truth.py"


rule plot_ground_truth:
    localrule: True
    input:
        truth=rules.align_truth.output[0],
    output:
        png=f"{RESULTS}/ground_truth.png",
        pdf=f"{RESULTS}/ground_truth.pdf",
    log:
        "logs/plot_ground_truth.log",
    script:
        "../scripts/plot_ground_truth.py"
