"""What may be tried: the knobs and their values (``param``), the search space loaded from YAML and trimmed to the
machine, the workload and the ranks (``search_space``, ``rank_space``), and the likely winners tried early
(``likely``).

May import: nothing else in ``search``; below it ``trial``, ``workloads``, ``machine`` and the records at the top.
"""
