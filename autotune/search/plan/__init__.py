"""The search itself: what to queue next and when a trial, a phase or the search stops. The queue and the planned
search (``queue``, ``coordinate``: the bundle apart, one knob at a time; ``batch_walk``), earlier studies' winners
(``warm_start``), the ceilings' runs and their climb over workers (``ceiling_runs``, ``climb``), compile last and
its gate (``compile_last``, ``compile_gate``), pruning (``pruning``), the sampler's convergence (``convergence``),
the phases (``phases``), and the frozen context backends get in place of the tuner (``context``).

May import: ``search.record``, ``search.space``, ``search.choose``; below them ``trial``, ``workloads``, ``machine``
and the records at the top. Not ``search.backends`` or the tuner.
"""
