"""What the user trains: torchvision models and synthetic or ImageFolder data by name (``build``), the built-in
text workload (``text``), the workload contract a user's ``module:callable`` follows (``contract``: its docstring
is the contract), and the global batch (gradient accumulation).

May import: ``machine`` and the records at the top. Not ``trial``, ``search``, ``view`` or ``cli``.
"""
