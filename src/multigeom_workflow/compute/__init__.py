"""
The per-image computation: one GPU (or CPU share) per job (`gpus`), the typed per-image
request (`request`), the estimator's engines (`engine`: fast; `estimate`: the entry
point, fast or upstream), warm workers (`workers`), the light per-image job process
(`client`), the hook through which a test or benchmark puts an estimator in place of
the real one (`hook`), and such a stand-in for orchestration tests (`standin`).

Importing this package imports nothing heavy: the per-image job's process
(``python -m multigeom_workflow.compute.client``) must start in milliseconds.
"""
