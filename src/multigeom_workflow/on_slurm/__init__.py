"""
The workflow's side of a SLURM cluster, on the login node, around the maintained
``snakemake-executor-plugin-slurm``: every way an allocation ends seen as an end, and
a status query that cannot answer never taken for one (`status`: a layer over the
plugin's status query, with SLURM's own commands in `queries`); submissions that
cannot fail halfway, too long for the command line or with their reply lost
(`submit`: a layer over the plugin's sbatch calls); and allocations that an earlier
run's Snakemake left running when it ended abruptly (`allocations`). Shards and
their time limits are planned in `multigeom_workflow.planning.slurm`; what an
allocation keeps of its finished images is `multigeom_workflow.compute.kept`.
"""
