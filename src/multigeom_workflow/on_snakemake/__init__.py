"""
What the workflow does to the running Snakemake, by concern.

`adapter` is the one module that touches Snakemake's internals (attributes and names
outside its documented API), each named in its `adapter.INTERNALS` and checked
against the installed Snakemake by tests/test_snakemake_hooks.py;
`multigeom_workflow.snakemake_hooks` still holds the rest, moving here concern by
concern.
"""
