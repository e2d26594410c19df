# The embedded demo: test photographs, training crops, synthetic areas, encoders and
# diffusion models, all made offline and deterministically, in upstream's run layout.
# Built once; a second run finds them and skips them.

from multigeom_workflow.scenario import DEMO_AREAS, DEMO_ENCODERS
from multigeom_workflow.test_images import DEMO_TEST_PHOTOS


rule export_demo_photos:
    localrule: True
    output:
        [f"{RUNS}/demo/test_images/img{i:04d}.png" for i in range(len(DEMO_TEST_PHOTOS))],
    log:
        "logs/export_demo_photos.log",
    script:
        "../scripts/export_demo_photos.py"


rule cut_training_crops:
    localrule: True
    output:
        f"{RUNS}/demo/train_crops.pt",
    params:
        n_crops=DEMO["n_train_crops"],
        seed=DEMO["seed"],
    log:
        "logs/cut_training_crops.log",
    script:
        "../scripts/cut_training_crops.py"


rule simulate_area:
    localrule: True
    input:
        crops=rules.cut_training_crops.output[0],
    output:
        f"{RUNS}/demo/areas/{{area}}.pt",
    wildcard_constraints:
        area="|".join(DEMO_AREAS),
    params:
        seed=DEMO["seed"],
        noise_sigma=DEMO["noise_sigma"],
    log:
        "logs/simulate_area/{area}.log",
    script:
        "../scripts/simulate_area.py"


rule fit_demo_encoder:
    localrule: True
    input:
        crops=rules.cut_training_crops.output[0],
        area=rules.simulate_area.output[0],
    output:
        f"{RUNS}/encoders/{{encoder}}/{{area}}/best_model.pt",
    wildcard_constraints:
        encoder="|".join(DEMO_ENCODERS),
        area="|".join(DEMO_AREAS),
    params:
        epochs=DEMO["readout_epochs"],
        lr=DEMO["readout_lr"],
        seed=DEMO["seed"],
    log:
        "logs/fit_demo_encoder/{encoder}/{area}.log",
    threads: 1
    script:
        "../scripts/fit_demo_encoder.py"


rule train_demo_diffusion:
    localrule: True
    input:
        crops=rules.cut_training_crops.output[0],
        encoder=rules.fit_demo_encoder.output[0],
    output:
        f"{RUNS}/diffusion/{{encoder}}/{{area}}/final_model.pt",
    wildcard_constraints:
        encoder="|".join(DEMO_ENCODERS),
        area="|".join(DEMO_AREAS),
    params:
        diffusion=SCENARIO.diffusion,
    log:
        "logs/train_demo_diffusion/{encoder}/{area}.log",
    benchmark:
        "benchmarks/train_demo_diffusion/{encoder}/{area}.tsv"
    threads: 1
    script:
        "../scripts/train_demo_diffusion.py"
