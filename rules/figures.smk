# Fig. 4D-E: A_k versus k for G(x) and J(x), from Stage 5's metrics.


rule plot_fig4de:
    input:
        **({"ceiling": rules.align_ceiling.output[0]} if CEILING_IMAGES else {}),
        metrics=rules.align_configs.output[0],
    output:
        png=report(
            LAYOUT.result("fig4de.png"),
            caption="../report/fig4de.rst",
            category="Figure",
            labels={"figure": "Fig. 4D-E"},
        ),
        pdf=LAYOUT.result("fig4de.pdf"),
    log:
        "logs/plot_fig4de.log",
    benchmark:
        "logs/benchmarks/plot_fig4de/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        seeds=SCENARIO.monte_carlo_seeds,  # said in the figure's title
    script:
        "../scripts/plot_fig4de.py"


# The top eigenvectors of G(x) and J(x) as 64x64 images, for the first
# `eigenvector_images` test images of every configuration, with the noise ceiling's
# second estimate of G(x) where there is one. Its inputs are exactly the per-image files
# it reads, so that it reruns only when one of them changes.


rule plot_eigenvectors:
    input:
        **(
            {
                "second": [
                    SCENARIO.ceiling_file(c.encoder, c.area, i)
                    for i in range(min(EIGENVECTOR_IMAGES, CEILING_IMAGES))
                    for c in SCENARIO.configurations
                ]
            }
            if min(EIGENVECTOR_IMAGES, CEILING_IMAGES)
            else {}
        ),
        first=[
            SCENARIO.per_image_file(c.encoder, c.area, i)
            for i in range(EIGENVECTOR_IMAGES)
            for c in SCENARIO.configurations
        ],
    output:
        png=report(
            LAYOUT.result("eigenvectors.png"),
            caption="../report/eigenvectors.rst",
            category="Figure",
            labels={"figure": "Eigenvectors"},
        ),
        pdf=LAYOUT.result("eigenvectors.pdf"),
    log:
        "logs/plot_eigenvectors.log",
    benchmark:
        "logs/benchmarks/plot_eigenvectors/run.tsv"
    localrule: True
    conda:
        CONDA_ENV
    params:
        n_vectors=EIGENVECTORS_DRAWN,  # per matrix (G, its second estimate, J)
    script:
        "../scripts/plot_eigenvectors.py"
