"""
The run's settings: the workflow's vocabulary (`names`), settings files (`files`), how a
bad value is reported (`errors`), the checks that need no input file (`checks`), and the
configuration loaded as Snakemake loads it (`load`). The lowest layer: it imports no
other part of the package.
"""
