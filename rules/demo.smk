# The embedded demo: test photographs, training crops, synthetic areas, encoders and
# diffusion models, all made offline and deterministically, in upstream's run layout.
# Built once; a second run finds them and skips them.

from multigeom_workflow.settings.names import DEMO_AREAS, DEMO_ENCODERS
from multigeom_workflow.inputs.images import DEMO_TEST_PHOTOS

# The figures whose lines a poor encoder empties of meaning, named in its warning.
SCIENCE_FIGURES = " and ".join(map(LAYOUT.result, ("fig4de.png", "ground_truth.png")))

# At the start of every run, one line per configuration whose encoder, already fitted,
# is too poor to inform the estimator (a fit in this run prints it when it ends).
hooks.say_encoder_warnings(RUN, DEMO["min_val_corr"], SCIENCE_FIGURES)


rule export_demo_photos:
    output:
        [LAYOUT.demo_test_image(i) for i in range(len(DEMO_TEST_PHOTOS))],
    log:
        "logs/export_demo_photos.log",
    benchmark:
        "logs/benchmarks/export_demo_photos/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    script:
        "../scripts/export_demo_photos.py"


rule cut_training_crops:
    output:
        f"{RUNS}/demo/train_crops.pt",
    log:
        "logs/cut_training_crops.log",
    benchmark:
        "logs/benchmarks/cut_training_crops/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        n_crops=DEMO["n_train_crops"],
        seed=DEMO["seed"],
    script:
        "../scripts/cut_training_crops.py"


rule simulate_area:
    input:
        crops=rules.cut_training_crops.output[0],
    output:
        f"{RUNS}/demo/areas/{{area}}.pt",
    log:
        "logs/simulate_area/{area}.log",
    benchmark:
        "logs/benchmarks/simulate_area/{area}.tsv"
    wildcard_constraints:
        area="|".join(DEMO_AREAS),
    localrule: True
    conda:
        CONDA_ENV
    params:
        seed=DEMO["seed"],
        noise_sigma=DEMO["noise_sigma"],
    script:
        "../scripts/simulate_area.py"


rule fit_demo_encoder:
    input:
        crops=rules.cut_training_crops.output[0],
        area=rules.simulate_area.output[0],
        # every demo photograph (a fixed list: changing n_images refits nothing)
        test_images=ancient(rules.export_demo_photos.output),
    output:
        encoder=LAYOUT.encoder_ckpt_pattern,
        report=LAYOUT.fit_report("{encoder}", "{area}"),
    log:
        "logs/fit_demo_encoder/{encoder}/{area}.log",
    benchmark:
        "logs/benchmarks/fit_demo_encoder/{encoder}/{area}.tsv"
    wildcard_constraints:
        encoder="|".join(DEMO_ENCODERS),
        area="|".join(DEMO_AREAS),
    localrule: True
    conda:
        CONDA_ENV
    threads: 1
    params:
        epochs=DEMO["readout_epochs"],
        lr=DEMO["readout_lr"],
        seed=DEMO["seed"],
        backbone_epochs=DEMO["backbone_epochs"],
        backbone_lr=DEMO["backbone_lr"],
        backbone_batch_size=DEMO["backbone_batch_size"],
        backbone_readout_lr=DEMO["backbone_readout_lr"],
    script:
        "../scripts/fit_demo_encoder.py"


rule train_demo_diffusion:
    input:
        crops=rules.cut_training_crops.output[0],
        encoder=rules.fit_demo_encoder.output.encoder,
    output:
        LAYOUT.diffusion_ckpt_pattern,
    log:
        "logs/train_demo_diffusion/{encoder}/{area}.log",
    benchmark:
        "logs/benchmarks/train_demo_diffusion/{encoder}/{area}.tsv"
    wildcard_constraints:
        encoder="|".join(DEMO_ENCODERS),
        area="|".join(DEMO_AREAS),
    localrule: True
    conda:
        CONDA_ENV
    threads: 1
    params:
        # train.seed per configuration with demo.diffusion_seeds: per_configuration
        diffusion=lambda w: demo_diffusion_params(w.encoder, w.area),
    script:
        "../scripts/train_demo_diffusion.py"


# How much each diffusion model's prediction depends on the responses, at the
# estimator's timesteps, on held-out crops (demo.conditioning_sensitivity): every
# demo configuration's in one job (each takes a few seconds, the process's start
# and imports as many).
rule check_conditioning:
    input:
        crops=rules.cut_training_crops.output[0],
        encoders=[c.encoder_ckpt for c in DEMO_CONFIGS],
        diffusions=[c.diffusion_ckpt for c in DEMO_CONFIGS],
    output:
        [LAYOUT.conditioning_report(c.encoder, c.area) for c in DEMO_CONFIGS],
    log:
        "logs/check_conditioning/run.log",
    benchmark:
        "logs/benchmarks/check_conditioning/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    threads: 1
    params:
        # configurations with settings of their own: each one's (the three below)
        **(
            {
                "per_configuration": [
                    canonical(
                        {
                            "diffusion": c.diffusion,
                            "timesteps": list(timestep_grid(c.estimator)),
                            "sigma": c.sigma,
                        }
                    )
                    for c in DEMO_CONFIGS
                ]
            }
            if SCENARIO.settings_per_configuration
            else {}
        ),
        # what it reads of the estimator, and nothing else (a change of n_samples
        # changes no result here)
        timesteps=list(timestep_grid(SCENARIO.estimator)),
        sigma=canonical(SCENARIO.estimator["monte_carlo"]["observation_noise_sigma"]),
        diffusion=DIFFUSION_PARAMS,
        n_images=16,
        # the (encoder, area) of each output, in their order
        configurations=[[c.encoder, c.area] for c in DEMO_CONFIGS],
    script:
        "../scripts/check_conditioning.py"


# The ground truth: the Fisher information of a demo area's GaborTeacher at each of
# the first n_images test images (a file per image, like the estimates), in one job
# per area: each image takes a fraction of a second, the process's start seconds.
rule area_fisher:
    input:
        area=rules.simulate_area.output[0],
        images=SCENARIO.test_image_files[: SCENARIO.n_images],
    output:
        [LAYOUT.truth_file("{area}", i) for i in range(SCENARIO.n_images)],
    log:
        "logs/area_fisher/{area}.log",
    benchmark:
        "logs/benchmarks/area_fisher/{area}.tsv"
    wildcard_constraints:
        area="|".join(DEMO_AREAS),
    localrule: True
    conda:
        CONDA_ENV
    threads: 1
    params:
        top_k=SCENARIO.top_k,
    script:
        "../scripts/area_fisher.py"
