"""One trial: the parent that starts a fresh child and watches it (``runner``, ``memwatch``; the process tree's
rules are ``machine.proctree``), the
child that measures (``worker``), the one typed schema of the events between them (``events``), the fork servers
that start CPU children without importing torch again, the profiler run, and the numerics check (``parity`` and its
child).

May import: ``workloads``, ``machine`` and the records at the top. Not ``search``, ``view`` or ``cli``: a trial
knows nothing of the study it belongs to.
"""
