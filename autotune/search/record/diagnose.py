"""What limited a trial, in one line, with the lever that would help.

``diagnose(figures, memory_cap_mb=..., trials=...)`` reads a trial's figures (the flat dict ``TrialResult.figures()``
gives, which is also what a study stores as each trial's user attributes) and returns a ``Diagnosis``: a label and
one line a person can act on. The thresholds are the module constants below; docs/diagnosis.md explains them.
Given the study's ``trials``, a lever the study already measured near this config (the same config with that one
knob changed, ``trials.neighbours``) is not suggested: the line says what was measured instead.

>>> diagnose({"status": "ok", "data_wait_share": 0.62, "config": {"num_workers": 0}}).label
'input-bound'
>>> print(diagnose({"status": "ok", "data_wait_share": 0.62}).explanation)
waiting for data 62% of the step: more DataLoader workers or lighter transforms
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple

from autotune.config import TrialConfig, finite_or_none
from autotune.measure import NOISY_REL_IQR
from autotune.search.record import trials as keys
from autotune.search.record.trials import neighbours

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["Diagnosis", "diagnose", "explain_study", "LABELS", "INPUT_BOUND_SHARE", "MEMORY_BOUND_FRACTION",
           "COMPILE_DOMINATED_SHARE", "KERNEL_HEAVY_SHARE", "levers_allowed", "measured_values", "Near",
           "MEASURED_STATUSES"]

# Share of step time spent blocked on the DataLoader from which a trial is input-bound. At 0.30 the model
# idles at least 30% of every step: hiding the loading (workers, prefetch) could make it up to 1/(1-0.30) = 1.43x
# faster, more than any compute-side knob usually gives; below it, loading is a secondary cost.
INPUT_BOUND_SHARE = 0.30

# Peak memory (PSS of the trial and its workers) as a fraction of the memory cap from which a trial is
# memory-bound. At 0.90 the next batch size up (roughly 2x activations) or one more worker would cross the cap,
# so memory, not speed, is what stops the config from growing.
MEMORY_BOUND_FRACTION = 0.90

# Share of the trial's wall time spent compiling (first step minus a settled step) from which it is
# compile-dominated. At 0.50 compiling costs more than start-up, warm-up and all measured windows together:
# a job as short as the trial would be faster without torch.compile.
COMPILE_DOMINATED_SHARE = 0.50

# The worker counts above a trial's that the input-bound lever looks for in the search space ("cores" is at most
# this on any host we know of): none there, and "more workers" is not a lever the space can pull.
MOST_WORKERS = 512

# Share of the training process's CPU time spent in the kernel from which reusing freed memory (malloc: hugepages
# or retain) is named as a lever. A training step should be almost all user-space math; at 0.10 the kernel is mostly
# faulting in and zeroing pages the allocator gave back the step before (measured: 13-16% with glibc's defaults
# on resnet18, 3% with retain, which was 18% faster).
KERNEL_HEAVY_SHARE = 0.10

# Every label diagnose() returns.
LABELS = ("input-bound", "compute-bound", "memory-bound", "compile-dominated", "failed", "unmeasured")

_MEMORY_STATUSES = ("oom", "over_memory", "shm")


class Diagnosis(NamedTuple):
    """``label`` is one of ``LABELS``; ``explanation`` is one line: the evidence, then the lever."""

    label: str
    explanation: str

    def line(self) -> str:
        return f"{self.label}: {self.explanation}"


Allowed = Callable[[str, Any], bool]  # (knob, value) -> may this lever be suggested?

# What counts as having measured a lever near a config: a trial that ran it to the end (its speed), one pruned as
# slow (the pruner stops only trials that cannot beat the best: evidence of no gain), and one that ran out of
# memory or over the cap (it does not fit here). Errors, crashes, time-outs and copies of other trials say
# nothing about the lever's speed, so the lever may still be suggested.
MEASURED_STATUSES = ("ok", "pruned", "oom", "over_memory")


def _numbers(ns: list[str]) -> str:
    return ns[0] if len(ns) == 1 else ", ".join(ns[:-1]) + " and " + ns[-1]


class Near:
    """What the study measured near one config: for a lever (a knob and which of its values pull it), the
    trials that are this config with only that knob changed to such a value. A neighbour counts as a gain when
    it was more than ``NOISY_REL_IQR`` faster (closer than that, a single trial's median does not tell)."""

    def __init__(self, trials, config: Mapping[str, Any], value: float | None) -> None:
        try:
            self.config = TrialConfig.from_dict(dict(config)) if config else None
        except Exception:  # a config from another version of the tuner: no evidence, the plain advice
            self.config = None
        self.trials = list(trials)
        self.value = value

    def measured(self, name: str, knob: str, pulls: Callable[[Any], bool]) -> str | None:
        """One line on what the study measured of lever ``name`` near this config, or None if nothing."""
        if self.config is None:
            return None
        found = [t for k, t in neighbours(self.trials, self.config, knob=knob)
                 if pulls(t.user_attrs[keys.CONFIG].get(knob)) and t.user_attrs.get(keys.DUPLICATE_OF) is None
                 and t.user_attrs.get(keys.STATUS) in MEASURED_STATUSES]
        if not found:
            return None
        ratios: dict[int, float] = {}
        parts = []
        for t in found:
            status = t.user_attrs.get(keys.STATUS)
            v = finite_or_none(t.user_attrs.get(keys.MEDIAN))
            if status == "ok" and v is not None and self.value:
                ratios[t.number] = v / self.value
                parts.append(f"{t.number} ({v / self.value:.2f}x)")
            else:
                what = {"pruned": "pruned as slow", "ok": "measured"}.get(status, "out of memory")
                parts.append(f"{t.number} ({what})")
        best = max(ratios, key=ratios.get, default=None)
        if best is not None and ratios[best] > 1 + NOISY_REL_IQR:
            t = next(t for t in found if t.number == best)
            why = " (over the memory limit)" if any(c > 0 for c in t.constraints.values()) else ""
            return f"{name} measured {ratios[best]:.1f}x faster in trial {best}{why}"
        return f"{name} measured in trial{'s' if len(parts) > 1 else ''} {_numbers(parts)}: no gain here"


def _compute_levers(config: Mapping[str, Any], kernel_share: float | None = None,
                    allowed: Allowed | None = None, near: Near | None = None) -> str:
    """The compute-side knobs this config has not tried yet (all of them when the config is unknown), minus
    those ``allowed`` rules out (outside the search space, or already measured slower); with ``near``, a lever
    the study measured near this config is replaced by what it measured."""
    ok = allowed or (lambda knob, value: True)
    # (lever, its TrialConfig knob, which values of the knob pull it, the value ``allowed`` is asked about)
    candidates = []
    if kernel_share is not None and kernel_share >= KERNEL_HEAVY_SHARE:
        # from the most to the least thorough: hugepages also removes what retain leaves (blocks over 32 MiB)
        current = config.get("malloc", "default")
        better = {"default": ("hugepages", "retain"), "retain": ("hugepages",)}.get(current, ())
        mode = next((m for m in better if ok("malloc", m)), None)
        if mode is not None:
            candidates.append((f"malloc {mode} ({100 * kernel_share:.0f}% of CPU time in the kernel)", "malloc",
                               lambda v, better=better: v in better, None))
    if config.get("amp", "off") == "off":
        candidates.append(("bf16 AMP", "amp", lambda v: v not in (None, "off"), ("amp", "bf16")))
    if not config.get("channels_last"):
        candidates.append(("channels_last", "channels_last", bool, ("channels_last", True)))
    if config.get("compile_mode", "none") == "none":
        candidates.append(("torch.compile", "compile_mode", lambda v: v not in (None, "none"),
                           ("compile_mode", "default")))
    threads = config.get("intra_op_threads")
    candidates.append(("more intra-op threads", "intra_op_threads",
                       lambda v: bool(threads) and v is not None and v > threads,
                       ("intra_op_threads", (threads or 0) + 1 if threads else None)))
    levers, measured = [], []
    for name, knob, pulls, ask in candidates:
        seen = near.measured(name, knob, pulls) if near is not None else None
        if seen is not None:
            measured.append(seen)
        elif ask is None or ok(*ask):
            levers.append(name)
    tail = f" ({'; '.join(measured)})" if measured else ""
    if not levers:
        return ("no untried compute knob of the search space left" + tail if measured
                else "every compute knob of the search space is in use or measured slower")
    return ", ".join(levers[:-1]) + (" or " if len(levers) > 1 else "") + levers[-1] + tail


def diagnose(figures: Mapping[str, Any], *, memory_cap_mb: float | None = None,
             allowed: Allowed | None = None, trials=None) -> Diagnosis:
    """Classify what limited a trial from its figures; never raises on missing figures.

    Checked in this order, first match wins: a memory failure (oom, over the cap, skipped as known
    infeasible) is memory-bound; then compile-dominated (``COMPILE_DOMINATED_SHARE`` of the
    wall time); then input-bound (``INPUT_BOUND_SHARE`` of the step waiting for data); then memory-bound (peak
    near the cap); otherwise compute-bound. Trials that errored, crashed or timed out are ``failed``; those
    without any measured window are ``unmeasured``. A pruned trial is classified from the windows it ran.

    ``figures`` may carry the trial's ``config`` dict (as stored user attributes do): the lever then names
    only the knobs the config has not used yet. ``allowed(knob, value)`` (``explain_study`` builds it) rules
    out levers outside the study's search space and those the study measured slower for this config.
    ``trials`` (the study's, e.g. ``study.get_trials(deepcopy=False)``): a lever measured near this config
    (``Near``: this config with that one knob changed; ``MEASURED_STATUSES``) is not suggested; the line says
    what was measured instead ("torch.compile measured in trials 6 (0.80x) and 8 (pruned as slow): no gain
    here", or "... 1.3x faster in trial 8" when it was faster yet not the answer).
    """
    status = figures.get("status") or "-"
    reason = (figures.get("reason") or "").strip()
    config = figures.get("config") or {}
    peak = finite_or_none(figures.get("peak_host_mb"))
    cap = finite_or_none(memory_cap_mb)
    workers = config.get("num_workers")
    near = (Near(trials, config, finite_or_none(figures.get("median_samples_per_s")))
            if trials is not None and config else None)

    if status == "shm":  # the loader's batches in flight, not the model's memory (trial.loader_watch)
        return Diagnosis("memory-bound", f"{reason or 'the DataLoader ran out of shared memory'}"[:160]
                         + ": fewer workers or a smaller prefetch_factor, or more shared memory (docker run "
                         "--shm-size)")
    if status in _MEMORY_STATUSES or status == "skipped":
        what = "ran out of memory" if status == "oom" else ("killed over the memory cap" if status == "over_memory"
                                                             else "not run (a smaller batch ran out of memory)")
        return Diagnosis("memory-bound", f"{what}: a smaller batch, bf16 AMP or fewer workers, or a larger cap")
    if status in ("error", "crashed", "timeout"):
        return Diagnosis("failed", f"{status}: {reason or 'no reason recorded'}"[:200])

    share = finite_or_none(figures.get("data_wait_share"))
    measured = share is not None or finite_or_none(figures.get("median_samples_per_s")) is not None
    if not measured:
        return Diagnosis("unmeasured", f"{status}: no measured window" + (f" ({reason})" if reason else ""))

    compile_s, wall_s = finite_or_none(figures.get("compile_s")), finite_or_none(figures.get("wall_s"))
    if compile_s and wall_s and compile_s >= COMPILE_DOMINATED_SHARE * wall_s:
        mode = config.get("compile_mode")
        other = " or 'default' over max-autotune" if mode in ("max-autotune", "max-autotune-no-cudagraphs") else ""
        return Diagnosis("compile-dominated",
                         f"compiling took {compile_s:.1f} s of the {wall_s:.1f} s trial: torch.compile pays off "
                         f"only on long jobs (the recommendation prices it over --run-length); compile_mode none "
                         f"for short runs{other}")
    if share is not None and share >= INPUT_BOUND_SHARE:
        lever = ("more DataLoader workers (it loads in the training loop now) or lighter transforms"
                 if workers == 0 else "more DataLoader workers, a larger prefetch_factor or lighter transforms")
        if workers is None:
            lever = "more DataLoader workers or lighter transforms"
        seen = near.measured("more DataLoader workers", "num_workers",
                             lambda v: v is not None and v > (workers or 0)) if near is not None else None
        if seen is not None:
            lever = f"lighter transforms ({seen})"
        elif workers is not None and allowed is not None and not any(  # the space's, not what was measured
                getattr(allowed, "offers", allowed)("num_workers", w)
                for w in range(workers + 1, max(MOST_WORKERS, workers + 2))):
            lever = (f"{workers} worker(s) is the most the search space offers here: lighter transforms, decoding "
                     "on the GPU or caching decoded tensors (the ceilings name what each buys)")
        return Diagnosis("input-bound", f"waiting for data {100 * share:.0f}% of the step: {lever}")
    if peak is not None and cap and peak >= MEMORY_BOUND_FRACTION * cap:
        return Diagnosis("memory-bound", f"peak memory {peak:.0f} MiB is {100 * peak / cap:.0f}% of the "
                                         f"{cap:.0f} MiB cap: a larger batch would not fit; bf16 AMP or fewer "
                                         "workers free memory")
    wait = f"waiting for data only {100 * share:.0f}% of the step" if share is not None else "data wait not measured"
    levers = _compute_levers(config, finite_or_none(figures.get("kernel_cpu_share")), allowed, near)
    return Diagnosis("compute-bound", f"{wait}, the model's math is the limit: {levers}")


def measured_values(study: Study) -> dict[tuple, float]:
    """Best value per config (as a sorted item tuple) over the study's finished trials."""
    measured: dict[tuple, float] = {}
    for t in study.get_trials(deepcopy=False):
        c = t.user_attrs.get(keys.CONFIG)
        if c and t.value is not None:
            key = tuple(sorted(c.items()))
            measured[key] = max(measured.get(key, 0.0), float(t.value))
    return measured


def levers_allowed(study: Study, config: Mapping[str, Any], value: float | None,
                   measured: dict[tuple, float] | None = None) -> Allowed:
    """For one trial of ``study``: a lever is allowed when the study's search space holds it and the study has
    not measured this config with that one knob changed as slower (or infeasible). Pass ``measured`` (from
    ``measured_values``) when asking for many trials."""
    params = (study.user_attrs.get(keys.STUDY_SPACE) or {}).get("parameters")
    measured = measured_values(study) if measured is None else measured

    def offers(knob: str, new: Any) -> bool:  # the space holds it (``allowed.offers``)
        if params is None:
            return True
        if knob not in params:
            return False
        choices = params[knob].get("choices") or []
        if knob == "intra_op_threads":
            return new is not None and any(isinstance(c, int) and c >= new for c in choices)
        if knob == "compile_mode":
            return bool([c for c in choices if c != "none"])
        return new in choices

    def allowed(knob: str, new: Any) -> bool:
        if not offers(knob, new):
            return False
        if value is None or not config:
            return True
        changed = dict(config, **{knob: new})
        other = measured.get(tuple(sorted(changed.items())))
        return other is None or other > value

    allowed.offers = offers  # type: ignore[attr-defined]
    return allowed


def explain_study(study: Study, trial_numbers: Iterable[int] | None = None) -> list[str]:
    """One ``#N label: explanation`` line per trial of an Optuna study (in ``trial_numbers`` order if given)."""
    cap = study.user_attrs.get(keys.STUDY_MEMORY_CAP)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    order = list(trial_numbers) if trial_numbers is not None else sorted(trials)
    lines = []
    measured = measured_values(study)
    every = list(trials.values())
    for n in order:
        t = trials.get(int(n))
        if t is None:
            continue
        ua = dict(t.user_attrs)
        if "status" not in ua:
            ua[keys.STATUS] = "running" if t.state.name == "RUNNING" else t.state.name.lower()
        allowed = levers_allowed(study, ua.get(keys.CONFIG) or {}, t.value, measured)
        lines.append(f"#{t.number:<4} {diagnose(ua, memory_cap_mb=cap, allowed=allowed, trials=every).line()}")
    return lines
