"""
The importable code of the Fig. 4D-E workflow (Azeglio et al. 2026): the scenario of a
run and its validation, the test images, the embedded demo, the per-image estimation
through upstream `multigeom`, Stage 5 and the figure. The Snakefile and the scripts of
its rules call these modules; the estimator itself is upstream's.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
