"""The user's run, measured: the steps of the training (or inference) the recommendation is for, timed where it
runs (``with rec.apply() as run:``, the Lightning and Hugging Face callbacks), in windows that settle as a trial's
do (``autotune.measure``), compared in one line with what the trials measured for the config (``judge``), watched
for a sustained slow-down while it trains (``watch``), and kept as a record beside the trials, never among them.

``run`` holds the hooks (torch's global optimizer step post hook, ``prepare_input``'s batches, a framework's
batch hooks); ``windows`` turns steps into windows; ``host`` samples what changed on the machine (memory, the
cores other processes take); ``judge`` holds the within/below/above rule, whose error rate
``benchmarks/field.py`` and ``tests/field/test_judge.py`` show by simulation.

May import: ``machine`` and the records at the package's top (``config``, ``result``, ``measure``, ``errors``).
Nothing above: ``recommendation``, ``applied`` and ``integrations`` call it, and give it the trials' figures
(``judge.Claim``) and where to keep its record (a callable).
"""

from autotune.field.judge import Claim
from autotune.field.run import FieldRun, FieldSpec

__all__ = ["Claim", "FieldRun", "FieldSpec"]
