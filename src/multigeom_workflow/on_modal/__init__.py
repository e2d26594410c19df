"""
The workflow's side of Modal: its per-image files on the executor plugin's Volume
(`volume`) and ``multigeom-workflow modal-check``, a first contact with an account
(`check`). The executor plugin itself is `snakemake_executor_plugin_modal`.
"""
