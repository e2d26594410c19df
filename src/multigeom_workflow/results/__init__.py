"""
From per-image files to results: their verification before Stage 5 (`verify`), Stage 5's
subspace alignment (`alignment`), the noise ceiling and the ground truth (`science`),
Fig. 4D-E and the ground-truth figure (`figure`), the Snakemake report's tables
(`report`).
"""
