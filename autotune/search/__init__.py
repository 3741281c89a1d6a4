"""The tuner and its decisions: the search space (it trims itself to the hardware and the workload), where
studies live (``storage``, ``locks``), what a stored study says (``trials``: attribute keys, the one outcome
mapping, read-only queries), the trial protocol every backend follows, the queue, the planned search
(bundle apart, batch walk, one knob at a time, compile last), warm start, pruning, the compile gate, convergence,
the finalists, the payback of compile, what limited a trial (``diagnose``) and what one knob did
(``effects``); ``backends`` (one ABC; local, Ray), which like the finalists get a frozen context from the tuner
(``context``), never the tuner; Optuna's private attributes are read in one place (``optuna_compat``).

May import: ``trial``, ``workloads``, ``machine`` and the records at the top. Not ``view`` or ``cli``.
"""
