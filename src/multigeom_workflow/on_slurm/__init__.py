"""
The workflow's side of a SLURM cluster, on the login node, around the maintained
``snakemake-executor-plugin-slurm``: every way an allocation ends seen as an end
(`status`: a layer over the plugin's status query), and allocations that an earlier
run's Snakemake left running when it ended abruptly (`allocations`). Shards and
their time limits are planned in `multigeom_workflow.planning.slurm`; what an
allocation keeps of its finished images is `multigeom_workflow.compute.kept`.
"""
