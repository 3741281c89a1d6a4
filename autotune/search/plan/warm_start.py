"""Warm start: a new study's first trials include the winners of the studies already in its storage that were
measured on the same hardware (another model, image size or task).

What a machine rewards transfers between workloads better than what a model rewards: thread counts, DataLoader
workers, the allocator, bf16, channels_last and compile are about the cores, caches and libraries, and those
are the same. So each earlier winner is mapped into this study's space knob by knob (``params_for``) and
measured like any trial: a winner that does not transfer costs one trial, one that does puts the search near
the best within its first few trials. Only studies of this hardware fingerprint and this kind of device are
read (never another machine's figures), at most ``WARM_START_MAX`` of them, most recently created first, and
only studies of the same world size (``Workload.nproc_per_node``): one process's threads and workers are not a
config for N ranks sharing the cores, nor the reverse.

The batch size is carried over too, mapped to the nearest batch this space offers (the smaller one of two as
near): a larger model or image needs more memory per sample, but a batch that does not fit is recorded as
infeasible like any other, and the batch walk explores the likely winner's neighbourhood anyway, so the
earlier winner's batch adds a point the walk would reach late or never.

>>> queue_warm_start(study, space, storage=storage, fingerprint=hw.fingerprint, device="cpu",
...                  enqueue=study_queue.enqueue, log=print)                              # doctest: +SKIP
trial 2 is a warm start: the winner of resnet18-train-64px-synthetic-cpu-... #14 (bs=64 w=1 ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys
from autotune.config import TrialConfig, device_family
from autotune.errors import ConfigError
from autotune.search.record.trials import MemoryLimit, config_of, feasible_by_config

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["WARM_START_MAX", "Winner", "earlier_winners", "params_for", "queue_warm_start"]

# How many earlier winners a new study measures among its first trials: each costs one trial when it does
# not transfer, so a few, not every study in the storage.
WARM_START_MAX = 3



@dataclass(frozen=True)
class Winner:
    """The config an earlier study settled on: its recommendation, else its best feasible measured trial."""

    study_name: str
    trial_number: int | None
    config: TrialConfig
    samples_per_s: float | None
    recommended: bool  # from the study's recommendation (else its best search trial)

    @property
    def label(self) -> str:
        """``<study name> #<trial>``: the value of the ``warm_start_from`` attribute of the trial it seeds."""
        return f"{self.study_name} #{self.trial_number}" if self.trial_number is not None else self.study_name


def earlier_winners(storage, *, fingerprint: str, device: str, exclude: str, world_size: int = 1) -> list[Winner]:
    """The winners of every other study in ``storage`` measured on hardware ``fingerprint`` with the same
    kind of device (``cpu`` / ``cuda``) and ``world_size`` ranks, most recently created study first. A study
    without a stored
    recommendation gives its best feasible trial measured on this hardware; one with neither gives nothing.
    ``exclude``: this study's own name."""
    import optuna

    family = device_family(device)
    found = []
    for frozen in storage.get_all_studies():
        ua = frozen.user_attrs
        if frozen.study_name == exclude or ua.get(keys.STUDY_FINGERPRINT) != fingerprint:
            continue  # another machine's figures say nothing about this one
        workload = ua.get(keys.STUDY_WORKLOAD) or {}
        if device_family(str(workload.get("device", "cpu"))) != family:
            continue  # a CPU study's winner is no config for a GPU, nor the reverse
        if int(workload.get("nproc_per_node", 1)) != world_size:
            continue  # threads and workers per rank: N ranks share the cores one process had to itself
        winner = _from_recommendation(frozen.study_name, ua.get(keys.STUDY_RECOMMENDATION), fingerprint)
        if winner is None:
            study = optuna.load_study(study_name=frozen.study_name, storage=storage)
            winner = _best_trial(study, fingerprint)
        if winner is not None:
            found.append((storage.get_study_id_from_name(frozen.study_name), winner))
    return [w for _, w in sorted(found, key=lambda pair: -pair[0])]


def _from_recommendation(name: str, rec: dict | None, fingerprint: str) -> Winner | None:
    if not isinstance(rec, dict) or not isinstance(rec.get("config"), dict):
        return None
    if (rec.get("hardware") or {}).get("fingerprint", fingerprint) != fingerprint:
        return None
    try:
        config = TrialConfig.from_dict(rec["config"])
    except ConfigError:  # written by another version: the study's trials still say what won
        return None
    measured = rec.get("measured") or {}
    return Winner(name, (rec.get("provenance") or {}).get("trial"), config, measured.get("median_samples_per_s"),
                  recommended=True)


def _best_trial(study: Study, fingerprint: str) -> Winner | None:
    feasible = feasible_by_config(study, fingerprint, MemoryLimit.of_study(study))
    if not feasible:
        return None
    best = max(feasible.values(), key=lambda t: t.value or 0.0)
    return Winner(study.study_name, best.number, config_of(best), best.value, recommended=False)


def params_for(config: TrialConfig, space) -> dict[str, Any]:
    """``config`` (another study's winner) as Optuna params of ``space``, knob by knob, in sampling order.

    A knob the space does not search is left out (its fixed value, if any, applies). A number (batch size,
    workers, threads) becomes the nearest choice, the smaller of two as near; a thread count left to torch's
    default (None) and a value the space does not offer (e.g. bf16 where it was trimmed) become the space's
    baseline value. A parameter whose condition (``when``) does not hold for the mapped values is left out.

    >>> params_for(TrialConfig(batch_size=100, channels_last=True), space)   # doctest: +SKIP
    {'batch_size': 128, 'channels_last': True}
    """
    values: dict[str, Any] = {}
    for p in space.params:
        if not p.holds(values):
            continue
        v = getattr(config, p.name, None)
        if p.type == "int" and isinstance(v, int) and not isinstance(v, bool) and v not in p.choices:
            v = min(p.choices, key=lambda c: (abs(c - v), c))
        if v is None or v not in p.choices:
            base = space.baseline.get(p.name)
            v = base if base in p.choices else p.choices[0]
        values[p.name] = v
    return values


def queue_warm_start(study: Study, space, *, storage, fingerprint: str, device: str, enqueue: Callable[..., None],
                     log: Callable[[str], None], most: int = WARM_START_MAX, world_size: int = 1) -> int:
    """Queue up to ``most`` earlier winners (``earlier_winners``) mapped into ``space`` (``params_for``),
    each with ``warm_start_from: "<study name> #<trial>"``; returns how many were queued now.

    A winner whose mapped config the study already has in any state (e.g. the baseline or the likely winner)
    or that an earlier winner mapped to is skipped, and the warm starts a killed run already queued count
    against ``most``: re-entered after a kill, nothing is queued twice. The
    caller holds the study's server lock (PostgreSQL/MySQL), as ``study_queue.queue_first_trials`` does.
    ``enqueue(study, space, params, **roles)`` queues one trial (``study_queue.enqueue``)."""
    if most <= 0:
        return 0
    trials = study.get_trials(deepcopy=False)
    left = most - sum(1 for t in trials if t.user_attrs.get(keys.WARM_START))
    if left <= 0:
        return 0
    seen = {c.key() for t in trials if (c := config_of(t, space)) is not None}
    queued = 0
    for winner in earlier_winners(storage, fingerprint=fingerprint, device=device, exclude=study.study_name,
                                  world_size=world_size):
        params = params_for(winner.config, space)
        config = space.effective(params)
        if config.key() in seen:
            continue
        seen.add(config.key())
        enqueue(study, space, params, **{keys.WARM_START: winner.label})
        queued += 1
        speed = f", {winner.samples_per_s:.1f} samples/s there" if winner.samples_per_s else ""
        what = "the recommendation" if winner.recommended else "the best trial"
        log(f"trial {len(trials) + queued - 1} is a warm start: {what} of study {winner.label}{speed}, mapped "
            f"to this space ({config.short()})")
        if queued >= left:
            break
    return queued
