"""The study as stored: where it lives and who may write to it (``storage``, ``locks``), what its trials say
(``trials``: attribute keys, the one outcome mapping, read-only queries), Optuna's private attributes read in one
place (``optuna_compat``), and the read-outs of what was measured: what limited a trial (``diagnose``), what one
knob did (``effects``) and the model of the pipeline, the data path's and the model's ceilings (``ceilings``).

May import: nothing else in ``search``; below it ``trial``, ``workloads``, ``machine`` and the records at the top.
"""
