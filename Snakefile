# Fig. 4D-E of Azeglio et al. (2026): per-image G(x) and J(x) for every test image of
# every (encoder, area) configuration, Stage 5 (subspace alignment) and the figure.
# Usage: snakemake --profile profiles/local-cpu   (see README.md)
# Every rule but the per-image ones (estimate_image, estimate_image_ceiling) is a
# localrule: with a remote executor (Modal, SLURM) only the per-image G(x) and J(x)
# estimates leave this machine.

from snakemake.utils import min_version

min_version("9.27")


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/demo.smk"
include: "rules/fetch.smk"
include: "rules/estimate.smk"
include: "rules/alignment.smk"
include: "rules/science.smk"
include: "rules/figures.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
