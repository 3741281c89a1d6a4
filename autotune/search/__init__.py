"""The tuner (``tuner``, the door) and its jobs, each in its own folder, importing only the folders before it:

- ``record``: the study as stored and its read-outs (imports nothing else in search);
- ``space``: what may be tried (imports nothing else in search);
- ``choose``: after the search: finalists, checks, the confirmed claim (imports ``record``);
- ``plan``: what to queue next, when to stop (imports ``record``, ``space``, ``choose``);
- ``backends``: where trials run and the protocol each follows (imports ``record``, ``plan``, ``space``).

May import: ``trial``, ``workloads``, ``machine`` and the records at the top. Not ``view`` or ``cli``.
"""
