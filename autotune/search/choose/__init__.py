"""After the search: which config, and how sure. The time the finalists and the confirmation take (``time_plan``;
``finalists``' budget rules), who gets a finalist round and how long its runs are (``contenders``), the finalists'
interleaved rounds and what they measured (``finalist_rounds``), ties and extra rounds (``settle``), the checks of
the winner (``final_checks``: numerics, the worst-case batch; ``latency_floor``), what compile pays back over the
user's run (``payback``), the provisional pick where no round fits (``same_loader``: the pipeline tells apart what
one measurement each cannot), the claim confirmed in fresh rounds (``confirm``), the record they leave
(``confirmation``) and the recommendation rewritten with it (``rewrite``).

May import: ``search.record``; below it ``trial``, ``workloads``, ``machine``, the records and the recommendation at
the top. Not ``search.plan``, ``search.backends`` or the tuner.
"""
