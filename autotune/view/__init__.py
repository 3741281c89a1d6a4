"""What a person looks at: the self-contained HTML report of a study (plots, the top configs, what limited each
trial, the profile). The judgements it shows, the diagnosis line and the one-knob effects, are the search's
(``search.record.diagnose``, ``search.record.effects``): the search stores the one and prints the other as it goes.

May import: ``search`` (to read a stored study), ``trial``, ``workloads``, ``field`` (the user's runs, measured),
``machine`` and the records. Not ``cli``.
"""
