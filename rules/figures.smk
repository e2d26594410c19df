# Fig. 4D-E: A_k versus k for G(x) and J(x), from Stage 5's metrics.


rule plot_fig4de:
    localrule: True
    input:
        metrics=rules.align_configs.output[0],
        **({"ceiling": rules.align_ceiling.output[0]} if CEILING_IMAGES else {}),
    output:
        png=report(
            LAYOUT.result("fig4de.png"),
            caption="../report/fig4de.rst",
            category="Figure",
            labels={"figure": "Fig. 4D-E"},
        ),
        pdf=LAYOUT.result("fig4de.pdf"),
    params:
        seeds=SCENARIO.monte_carlo_seeds,  # said in the figure's title
    log:
        "logs/plot_fig4de.log",
    benchmark:
        "logs/benchmarks/plot_fig4de/run.tsv"
    script:
        "../scripts/plot_fig4de.py"
