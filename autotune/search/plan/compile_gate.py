"""Whether the search may start a torch.compile trial now, and the sampler that never proposes one.

A compile trial costs far more than a plain one (80-95 s per trial cold on the CPUs here, most of it
compiling), and a trial is never cut short: in a short run one ``max-autotune`` trial can take a large share
of the search. ``CompileGate`` holds compile back when its expected cost exceeds the time left for the search
(the time to the budget's end less the finalists' and the confirmation's reserve, ``Budget.search_reserve_s``):
the expected cost is the wall time of the study's first measured compile trial, or ``COMPILE_PRIOR_S`` before
there is one.
``compile_last.settle`` asks it before it queues compile on the best eager config.

Compile is tried last, on the best eager config (``compile_last``), so the sampler never proposes a compile
mode (``holding_back``): a proposed mode is replaced by ``"none"`` before the trial runs, so the trial's
parameter is the one that ran and Optuna learns only what was measured. Queued trials (fixed parameters: the
baseline, the planned search's steps, compile last, retries) are not the sampler's and run as queued. Both
backends use it: the local loop and the Ray searcher each ``start`` the gate with their clock, and both build
their sampler with ``protocol.make_sampler(hold_back=ctx.compile_gate)``. (Trials of studies from before
this rule may carry ``held_back``: why the sampler's compile proposal ran without compile then.)
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

from autotune.search.record import trials as keys

if TYPE_CHECKING:
    from autotune.search.budget import Budget
    from optuna import Study
    from optuna.trial import FrozenTrial

__all__ = ["CompileGate", "COMPILE_PRIOR_S", "holding_back"]

# What a compile trial is expected to cost before the study measured one, at least the typical trial of the run so
# far: the longest cold compile trial measured (benchmarks/cached_compile.py, 2-core AMX Xeon, 2026-11-28, 32 px,
# mode default: resnet18 110 s, mobilenet_v3_small 158 s; 80-95 s for resnet18 on the EPYCs before). At 90 s, the
# 10-minute mobilenet_v3_small run of quality.py that day started one with 99 s left for the search and had no
# finalist round left after it.
COMPILE_PRIOR_S = 160.0

_KNOB = "compile_mode"


class CompileGate:
    """``reason(study)``: why a compile trial may not start now, or None. Closed to nothing (always None)
    until a search ``start``s it with a budget that has an end."""

    def __init__(self) -> None:
        self.budget: Budget | None = None
        self.walls: list[float] = []

    def start(self, budget: Budget, walls: list[float]) -> None:
        """A search runs within ``budget``, appending its trials' walls to ``walls``."""
        self.budget, self.walls = budget, walls

    def stop(self) -> None:
        self.budget = None

    def expected_s(self, trials) -> tuple[float, str]:
        """The expected wall time of a compile trial and where it comes from."""
        for t in sorted(trials, key=lambda t: t.number):
            ua = t.user_attrs
            if ((ua.get(keys.CONFIG) or {}).get(_KNOB, "none") != "none" and ua.get(keys.WALL_S)
                    and ua.get(keys.DUPLICATE_OF) is None):
                return float(ua[keys.WALL_S]), f"trial {t.number}'s wall time"
        typical = statistics.median(self.walls) if self.walls else 0.0
        return max(COMPILE_PRIOR_S, typical), "prior: no compile trial measured yet"

    def reason(self, study: Study) -> str | None:
        if self.budget is None or self.budget.deadline is None:
            return None
        left = self.budget.deadline - time.monotonic() - self.budget.search_reserve_s(self.walls)
        expected, source = self.expected_s(study.get_trials(deepcopy=False))
        if expected <= left:
            return None
        # the figures first: `show` cuts reasons at 60 characters
        return f"compile held back: ~{expected:.0f} s expected, {max(0.0, left):.0f} s left for the search ({source})"


def holding_back(inner, gate: CompileGate):
    """``inner`` (an Optuna sampler) proposing ``compile_mode="none"`` instead of a compile mode: compile is
    queued last, on the best eager config (``compile_last``), never the sampler's pick. ``gate`` is kept for
    the backends' symmetry (they ``start`` it); it decides whether that last trial fits."""
    import optuna

    class _HoldingBack(optuna.samplers.BaseSampler):
        def __init__(self) -> None:
            self.inner = inner

        def infer_relative_search_space(self, study: Study, trial: FrozenTrial):
            return inner.infer_relative_search_space(study, trial)

        def sample_relative(self, study: Study, trial: FrozenTrial, search_space):
            params = inner.sample_relative(study, trial, search_space)
            dist = search_space.get(_KNOB)
            if (params.get(_KNOB, "none") != "none" and "none" in getattr(dist, "choices", ())
                    and self._hold(study, trial)):
                params = {**params, _KNOB: "none"}
            return params

        def sample_independent(self, study: Study, trial: FrozenTrial, param_name, param_distribution):
            value = inner.sample_independent(study, trial, param_name, param_distribution)
            if (param_name == _KNOB and value != "none" and "none" in getattr(param_distribution, "choices", ())
                    and self._hold(study, trial)):
                return "none"
            return value

        def before_trial(self, study: Study, trial: FrozenTrial) -> None:
            inner.before_trial(study, trial)

        def after_trial(self, study: Study, trial: FrozenTrial, state, values) -> None:
            inner.after_trial(study, trial, state, values)

        def reseed_rng(self) -> None:
            inner.reseed_rng()

        @staticmethod
        def _hold(study: Study, trial: FrozenTrial) -> bool:
            # queued with its compile mode (compile last, a retry): not the sampler's to change
            return _KNOB not in (trial.system_attrs.get(keys.FIXED_PARAMS) or {})

    return _HoldingBack()
