"""What a stored study says: the attribute keys trials carry, the one outcome mapping, read-only queries.

The tuner's modules read and write the attributes that carry the protocol through the key constants below
(as Optuna names ``_CONSTRAINTS_KEY``), so such a key is spelled once, here; the views and the CLI read them
through these constants too. User attributes are flat so optuna-dashboard shows them as
columns; the figures a measured trial stores are ``TrialResult.figures()``'s keys.

``outcome`` decides what a ``TrialResult`` means to Optuna, once: ok -> COMPLETE with the memory constraint;
out of memory, over the cap or known to be -> COMPLETE but infeasible (so the sampler learns the boundary;
a FAIL would be ignored and re-proposed); pruned or timed out -> PRUNED; anything else -> FAIL.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import MEMORY_STATUSES, TrialConfig, TrialResult

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial

__all__ = ["MemoryLimit", "Outcome", "outcome", "is_feasible", "feasible_by_config", "known", "baseline_trial",
           "baseline_value", "baseline_trial_any", "trial_rows", "config_of", "ROLES", "OWN_ATTRS", "knobs_apart",
           "one_knob_apart", "neighbours", "OBJECTIVE", "role", "departures", "NOT_MEASURED", "window_noise",
           "noise_of"]

# What the study maximises, named on the study (``Study.set_metric_names``) so optuna-dashboard, the optuna CLI
# and ``trials_dataframe`` (column ``value_samples/s``) say it instead of "Objective 0" / ``value``.
OBJECTIVE = "samples/s"

# --- user attributes of a trial -------------------------------------------------------------------------
CONFIG = "config"                # the TrialConfig that ran (to_dict)
QUEUED_CONFIG = "queued_config"  # the TrialConfig a queued trial will run, so `show` can say it
FINGERPRINT = "fingerprint"      # the hardware fingerprint of the machine that measured it
STATUS = "status"                # TrialResult.status, or "interrupted"
REASON = "reason"                # one line a person reads
WALL_S = "wall_s"
PEAK = "peak_host_mb"            # the trial's measured peak (a figure of TrialResult)
PEAK_DEVICE = "peak_device_mb"   # its device peak (reserved by PyTorch's caching allocator), on CUDA
PEAK_DEVICE_ALLOCATED = "peak_device_allocated_mb"  # the most its tensors held at once, on CUDA
TRIAL_DEVICE_CAP = "device_memory_cap_mb"  # the device memory cap the allocator enforced in the trial
USER_PARTS = "user_parts"        # the workload's own parts the trial ran (autotune.workloads.contract.PARTS)
TRIAL_CAP = "memory_cap_mb"      # the cap the trial ran under (the study's cap may change between runs)
LATENCY_P99 = "latency_p99_ms"   # inference: its steps' p99 latency (a figure of TrialResult; trial.latency)
BASELINE = "baseline"            # roles a trial is queued with, kept by its retry
LIKELY_WINNER = "likely_winner"
BATCH_LINE = "batch_line"        # -1 / +1: a step of the batch-size walk down / up
WARM_START = "warm_start_from"   # "<study name> #<trial>": an earlier study's winner (warm_start.py)
KNOB_STEP = "knob_step"          # "amp=off": a one-knob step of the planned search (coordinate.py)
REPEAT_OF = "repeat_of"          # the number of the trial whose config this one measures again (a noise decision)
BY_TURNS = "by_turns"            # a repeat run by turns beside another (backends.pairs): the s it stood stopped
ROUND_OF = "round_of"            # "a/b": the comparison (its two configs' first trials) a repeat is the 2nd round of
COMPILE_LAST = "compile_last"    # the compile mode tried on the best eager config once the eager search settled
PLAN_STEP = "plan_step"          # "baseline at batch 32": another config the planned search queued (coordinate.py)
RETRY_OF = "retry_of"            # the number of the interrupted trial this one repeats
REQUEUE_OF = "requeue_of"        # the number of the pruned trial this one re-runs (study_queue.requeue_far_pruned)
HELD_BACK = "held_back"          # why the sampler ran this trial without the compile it proposed (compile_gate)
DUPLICATE_OF = "duplicate_of"    # the number of the trial whose figures this one copies
WAITED_FOR = "waited_for"        # the number of the trial (another worker's) this one waited for
BOTTLENECK = "bottleneck"
TRACEBACK = "traceback"
NODE = "node"                    # the Ray node (its id) that ran it, or is running it
RAY_RETRIES = "ray_retries"      # times Ray Tune ran the trial again after its actor or node died
# figures of a measured trial (``TrialResult.figures()``'s keys) that the search and the views read back
SAMPLES = "samples_per_s"        # each measured window's rate
MEDIAN = "median_samples_per_s"
REL_IQR = "rel_iqr"              # the windows' spread, relative to their median
TOKENS = "tokens_per_s"          # each window's tokens/s, where the workload counts tokens
COMPILE_S = "compile_s"          # seconds torch.compile took in the trial (dynamo's clock)
DATA_WAIT_SHARE = "data_wait_share"
DATA_WAIT_S = "data_wait_s_per_step"
COMPUTE_S = "compute_s_per_step"
BATCH_BYTES = "batch_bytes"      # the first batch's bytes as a DataLoader worker shares it (trial.loader_watch)
BATCH_TENSORS = "batch_tensors"  # and its tensors (one descriptor each, in flight)

# --- system attributes (not shown by the dashboard) ----------------------------------------------------
MEASURING = "autotune_measuring"  # this trial claimed its config and is measuring it
RETRY_HISTORY = "retry_history"   # Optuna's heartbeat retry callback: the trials this one repeats
FIXED_PARAMS = "fixed_params"     # Optuna's enqueue_trial: the params a queued trial will run

# --- user attributes of the study ----------------------------------------------------------------------
STUDY_FINGERPRINT = "fingerprint"
STUDY_HARDWARE = "hardware"
STUDY_WORKLOAD = "workload"
STUDY_SPACE = "space"
STUDY_MEMORY_CAP = "memory_cap_mb"
STUDY_DEVICE_MEMORY = "device_memory_mb"  # the device memory cap of the study's latest run, on a GPU
STUDY_MEASURE = "measure"
STUDY_RECOMMENDATION = "recommendation"


def study_meta(workload, hardware, space, measure, device_memory_mb: float | None) -> dict[str, Any]:
    """What a study says of itself (its user attrs, kept up to date by each run): the workload, the machine, the
    space, the measurement and its caps."""
    return {STUDY_WORKLOAD: workload.to_dict(), STUDY_FINGERPRINT: hardware.fingerprint,
            STUDY_HARDWARE: hardware.summary_line(), STUDY_SPACE: space.to_dict(),
            STUDY_MEMORY_CAP: measure.memory_cap_mb, STUDY_MEASURE: measure.to_dict(),
            STUDY_DEVICE_MEMORY: device_memory_mb}
WALK_ANCHOR = "batch_walk_anchor"
PLAN = "search_plan"             # the planned search drives the first trials (coordinate.py); absent: older studies
PLAN_KEPT = "plan_kept"          # the config the planned search keeps as its best so far (coordinate.Plan.incumbent)
COMPILE_NO_ROOM = "compile_no_room"  # why a budget kept no room for compile on this CPU kind (search/plan/phases.py)
CONFIRM_TO_SEARCH = "confirm_to_search"  # the confirmation's reserve (s) the search spent (Budget.confirm_released)
EAGER_SETTLED = "eager_settled"  # {"why": ...}: the eager search has settled; compile is tried last (compile_last.py)
PARITY = "parity"  # trial number -> ParityResult.to_dict(): the numerics checks of the finalists
FINALIST_ROUNDS = "finalist_rounds"  # the finalists' runs so far: {"plan": digest, "runs": {...}} (finalist_rounds)
RUN_PHASE = "run_phase"  # + ":<host>": where that machine's run (in progress, or killed) stands (run_phase.py)

# The statuses of a finished trial that measured nothing of its config: the run was stopped (its retry measures it).
NOT_MEASURED = (None, "interrupted")

# A queued trial's role in the study, kept by its retry.
ROLES = (BASELINE, LIKELY_WINNER, BATCH_LINE, WARM_START, KNOB_STEP, REPEAT_OF, ROUND_OF, COMPILE_LAST, PLAN_STEP)

# A trial's own attributes, which a copy of its figures (a duplicate config) does not take over.
OWN_ATTRS = ROLES + (CONFIG, QUEUED_CONFIG, RETRY_OF, REQUEUE_OF, HELD_BACK, DUPLICATE_OF, WAITED_FOR, REASON,
                     WALL_S, RAY_RETRIES, BY_TURNS)

# what `show` says of a trial that has no result yet
_UNFINISHED = {"RUNNING": "running", "WAITING": "queued"}


@dataclass(frozen=True)
class MemoryLimit:
    """The memory a config may use: the cap trials are killed at, less the share a recommendation keeps free;
    on a GPU also the device memory cap (``MeasureSpec.device_memory_cap_mb``, enforced by the caching
    allocator during the trial), less the same share, for the most memory the trial's tensors held.

    Feasibility is worked out from each trial's stored peak against this limit whenever a decision is made,
    not read from the constraint stored when the trial was recorded: a resumed study may run under another
    cap (the default is a share of the memory free when the run starts), and a config that was over a lower
    cap is a candidate again under a higher one.
    """

    cap_mb: float | None
    margin: float = 0.0
    device_mb: float | None = None  # the device memory cap; None on the CPU
    # inference under a latency bound (``MeasureSpec.latency_p99_ms``): a config whose steps' p99 is over it is
    # infeasible, as one over the memory is; judged from the stored p99 against the current bound, likewise
    latency_p99_ms: float | None = None

    @classmethod
    def of(cls, measure, device_mb: float | None = None) -> "MemoryLimit":
        return cls(measure.memory_cap_mb, measure.memory_margin, device_mb, getattr(measure, "latency_p99_ms", None))

    @classmethod
    def of_study(cls, study: Study) -> "MemoryLimit":
        """The limit of the study's latest run (for readers without a tuner: show, export, report)."""
        measure = study.user_attrs.get(STUDY_MEASURE) or {}
        return cls(study.user_attrs.get(STUDY_MEMORY_CAP), measure.get("memory_margin", 0.0),
                   study.user_attrs.get(STUDY_DEVICE_MEMORY), measure.get("latency_p99_ms"))

    def latency_constraint(self, p99_ms: float | None) -> float | None:
        """Optuna's latency constraint (<= 0 meets the bound), or None without a bound. A trial with no
        measured p99 under a bound does not meet it: a recommendation must be known to."""
        if self.latency_p99_ms is None:
            return None
        return 1.0 if p99_ms is None else p99_ms / self.latency_p99_ms - 1.0

    def meets_latency(self, p99_ms: float | None) -> bool:
        c = self.latency_constraint(p99_ms)
        return c is None or c <= 0

    @property
    def usable_mb(self) -> float | None:
        return None if self.cap_mb is None else self.cap_mb * (1 - self.margin)

    def constraint(self, peak_mb: float | None) -> float:
        """Optuna's memory constraint for a peak: <= 0 fits with the margin, > 0 does not."""
        return peak_mb / self.usable_mb - 1.0 if (peak_mb and self.usable_mb) else -1.0

    def device_constraint(self, peak_device_mb: float | None,
                          peak_allocated_mb: float | None = None) -> float | None:
        """Optuna's device-memory constraint (<= 0 fits), or None off a GPU or without a device peak.

        Judged on the most the tensors held (``peak_allocated_mb``) against the cap less the margin: the
        reserved peak (``peak_device_mb``) also counts the allocator's cache and cuDNN's benchmark workspaces,
        which give way under the cap, so it would make runnable configs look infeasible. A trial recorded
        before allocated peaks were kept falls back to its reserved peak."""
        peak = peak_allocated_mb if peak_allocated_mb is not None else peak_device_mb
        if not self.device_mb or peak is None:
            return None
        return peak / (self.device_mb * (1 - self.margin)) - 1.0

    def fits(self, peak_mb: float | None, peak_device_mb: float | None = None,
             peak_allocated_mb: float | None = None) -> bool:
        """The host peak, and the device peak where there is one, fit with the margin to spare."""
        device = self.device_constraint(peak_device_mb, peak_allocated_mb)
        return self.constraint(peak_mb) <= 0 and (device is None or device <= 0)

    def binds(self, trial: FrozenTrial) -> bool:
        """A trial that ran out of memory, was killed over the cap, or was skipped as a larger batch of one
        that was, still says the config does not fit: an out-of-memory error always; a kill (or a skip) under
        a cap at least this limit's usable memory. A kill at a lower cap says nothing about a higher one.
        Trials recorded before the cap was stored per trial fall back to their peak (the reading at the kill,
        at least the cap then)."""
        ua = trial.user_attrs
        if ua.get(STATUS) not in ("over_memory", "skipped") or self.usable_mb is None:
            return True
        ran_under = ua.get(TRIAL_CAP) or ua.get(PEAK)
        return ran_under is None or ran_under >= self.usable_mb


@dataclass(frozen=True)
class Outcome:
    state: str  # "complete" | "pruned" | "fail"
    value: float | None = None
    memory_constraint: float | None = None  # <= 0 feasible
    device_memory_constraint: float | None = None  # <= 0 feasible; None off a GPU
    latency_constraint: float | None = None  # <= 0 meets the latency bound; None without one


def outcome(result: TrialResult, memory_cap_mb: float | None, margin: float = 0.0,
            device_mb: float | None = None, latency_p99_ms: float | None = None) -> Outcome:
    """Map a TrialResult to what Optuna records: decided here, once.

    ok -> COMPLETE, value = median samples/s, memory constraint = peak / (cap x (1 - margin)) - 1 (<= 0,
    feasible: it fits with the margin to spare); on a GPU (``device_mb``, the device memory cap) also a device
    constraint, ``device_memory_constraint``; under a latency bound (``latency_p99_ms``) a latency constraint, p99 /
    bound - 1, so the sampler learns the latency boundary as it learns the memory one.
    oom / over_memory / skipped -> COMPLETE but infeasible (constraint > 0): the sampler learns the boundary
    and does not propose it again (a FAIL would be ignored and re-proposed). pruned / timeout -> PRUNED.
    crashed / error -> FAIL, with the reason kept in the trial's attributes.
    """
    limit = MemoryLimit(memory_cap_mb, margin, device_mb, latency_p99_ms)
    if result.status == "ok":
        return Outcome("complete", float(result.median_samples_per_s or 0.0), limit.constraint(result.peak_host_mb),
                       limit.device_constraint(result.peak_device_mb, result.peak_device_allocated_mb),
                       limit.latency_constraint(result.latency_p99_ms))
    if result.status in MEMORY_STATUSES or result.status == "skipped":
        over = limit.constraint(result.peak_host_mb) if result.peak_host_mb else 0.0
        return Outcome("complete", 0.0, max(over, 1.0 if over <= 0 else over))
    if result.status in ("pruned", "timeout"):
        return Outcome("pruned")
    return Outcome("fail")


def is_feasible(trial: FrozenTrial, limit: MemoryLimit | None = None) -> bool:
    """The trial fits: with a ``limit``, a measured trial whose stored peak is under its usable memory (a trial
    that ran out of memory or was not measured does not fit); without one, every constraint the trial recorded
    is met (a trial with none is feasible)."""
    if limit is None or trial.user_attrs.get(STATUS) is None:
        return all(c <= 0 for c in trial.constraints.values())
    if trial.user_attrs.get(STATUS) != "ok":
        return False
    ua = trial.user_attrs
    return (limit.fits(ua.get(PEAK), ua.get(PEAK_DEVICE), ua.get(PEAK_DEVICE_ALLOCATED))
            and limit.meets_latency(ua.get(LATENCY_P99)))


def config_of(trial: FrozenTrial, space=None) -> TrialConfig | None:
    """The config a trial ran; for a queued trial, the one it will run (from ``space`` and its fixed params,
    else from what was recorded when it was queued); None when neither is known."""
    ua = trial.user_attrs
    if ua.get(CONFIG):
        return TrialConfig.from_dict(ua[CONFIG])
    fixed = trial.system_attrs.get(FIXED_PARAMS)
    if space is not None and fixed:
        return space.effective(fixed)
    return TrialConfig.from_dict(ua[QUEUED_CONFIG]) if ua.get(QUEUED_CONFIG) else None


# Fields that only mean something with DataLoader workers: a change of num_workers to or from 0 moves them too
# (TrialConfig normalises them), so that is one knob, not three.
_WORKER_FIELDS = ("prefetch_factor", "persistent_workers")


# knobs whose PyTorch default is TrialConfig's own (batch size, loader workers and threads are compared above)
_KNOBS = ("amp", "channels_last", "compile_mode", "malloc", "affinity", "bucket_by_length", "pin_memory",
          "cudnn_benchmark", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph")


def departures(config: TrialConfig) -> int:
    """How many of ``_KNOBS`` ``config`` changes from PyTorch's defaults (``TrialConfig()``'s).

    >>> departures(TrialConfig(batch_size=32)), departures(TrialConfig(channels_last=True, malloc="retain"))
    (0, 2)
    """
    plain = TrialConfig()
    return sum(getattr(config, k) != getattr(plain, k) for k in _KNOBS)


def knobs_apart(a: TrialConfig, b: TrialConfig) -> list[str]:
    """The knobs (``TrialConfig`` field names) in which two configs differ, a worker count's dependants
    folded into it when one side has no workers.

    >>> knobs_apart(TrialConfig(num_workers=0), TrialConfig(num_workers=2, prefetch_factor=4))
    ['num_workers']
    """
    apart = [f.name for f in dataclasses.fields(TrialConfig) if getattr(a, f.name) != getattr(b, f.name)]
    if "num_workers" in apart and 0 in (a.num_workers, b.num_workers):
        apart = [k for k in apart if k not in _WORKER_FIELDS]
    return apart


def one_knob_apart(a: TrialConfig, b: TrialConfig) -> str | None:
    """The one knob two configs differ in, or None when they are equal or differ in more than one."""
    apart = knobs_apart(a, b)
    return apart[0] if len(apart) == 1 else None


def neighbours(trials, config: TrialConfig, *, knob: str | None = None) -> list[tuple[str, Any]]:
    """``(knob, trial)`` for each trial among ``trials`` whose config is ``config`` with one knob changed
    (only ``knob``, when given), in trial order. Trials without a config (queued, never run) are skipped."""
    out = []
    for t in trials:
        other = t.user_attrs.get(CONFIG)
        if not other:
            continue
        k = one_knob_apart(config, TrialConfig.from_dict(other))
        if k is not None and (knob is None or k == knob):
            out.append((k, t))
    return out


def feasible_by_config(study: Study, fingerprint: str | None = None,
                       limit: MemoryLimit | None = None) -> dict[tuple, Any]:
    """Best measured (status ok) feasible trial per distinct config, among the trials measured on hardware
    ``fingerprint`` (default: the study's): a Ray cluster may mix kinds of nodes, a recommendation may not.
    Feasible under ``limit`` (default: the study's latest, ``MemoryLimit.of_study``)."""
    from optuna.trial import TrialState

    fingerprint = fingerprint or study.user_attrs.get(STUDY_FINGERPRINT)
    limit = limit or MemoryLimit.of_study(study)
    out: dict[tuple, Any] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(STATUS) != "ok" or t.user_attrs.get(DUPLICATE_OF) is not None:
            continue
        if fingerprint and t.user_attrs.get(FINGERPRINT, fingerprint) != fingerprint:
            continue
        if not is_feasible(t, limit):
            continue
        key = TrialConfig.from_dict(t.user_attrs[CONFIG]).key()
        if key not in out or (t.value or 0) > (out[key].value or 0):
            out[key] = t
    return out


def config_level(study: Study, trial) -> float:
    """The geometric mean of every measurement (status ok, not a copy) of ``trial``'s config on its hardware, the
    plan's repeats among them: a config measured twice is not judged by the luckier of its two trials."""
    key, fp = TrialConfig.from_dict(trial.user_attrs[CONFIG]).key(), trial.user_attrs.get(FINGERPRINT)
    logs = [math.log(t.value) for t in study.get_trials(deepcopy=False) if t.value and t.value > 0
            and t.user_attrs.get(STATUS) == "ok" and t.user_attrs.get(DUPLICATE_OF) is None
            and t.user_attrs.get(FINGERPRINT) == fp and TrialConfig.from_dict(t.user_attrs[CONFIG]).key() == key]
    return math.exp(sum(logs) / len(logs)) if logs else float(trial.value or 0.0)


def known(study: Study, fingerprint: str, limit: MemoryLimit | None = None
          ) -> tuple[dict[tuple, Any], list[tuple[TrialConfig, int]]]:
    """Finished (complete or pruned) measured trials of this hardware by config key (the first; a completed one
    over a pruned one, as a re-queued prune's re-run is), and the memory failures
    among them as (config, trial number). Copies and other machines' trials are not evidence, and neither is
    a kill over a lower cap than ``limit``'s (``MemoryLimit.binds``): that config is measured again."""
    from optuna.trial import TrialState

    done: dict[tuple, Any] = {}
    memory_failures: list[tuple[TrialConfig, int]] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        cfg = t.user_attrs.get(CONFIG)
        if not cfg or t.user_attrs.get(DUPLICATE_OF) is not None:
            continue
        if t.user_attrs.get(FINGERPRINT, fingerprint) != fingerprint:
            continue  # measured on another kind of machine (a Ray node): not evidence about this one
        if limit is not None and not limit.binds(t):  # killed or skipped under a lower cap: measure it again
            continue
        c = TrialConfig.from_dict(cfg)
        if c.key() not in done or (done[c.key()].state == TrialState.PRUNED and t.state == TrialState.COMPLETE):
            done[c.key()] = t  # a re-run of a pruned trial that completed is the answer
        if t.user_attrs.get(STATUS) in MEMORY_STATUSES:
            memory_failures.append((c, t.number))
    return done, memory_failures


def baseline_trial(study: Study):
    """The measured (status ok) baseline trial, or None."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(BASELINE) and t.user_attrs.get(STATUS) == "ok":
            return t
    return None


def baseline_value(study: Study) -> float | None:
    t = baseline_trial(study)
    return t.value if t is not None else None


def baseline_trial_any(study: Study):
    """The baseline trial in any state (queued, running, finished), or None."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(BASELINE):
            return t
    return None


def trial_rows(study: Study) -> list[dict[str, Any]]:
    """One flat dict per trial (for `show`, CSV, reports), from what the trials stored; ``feasible`` under the
    study's latest memory limit."""
    limit = MemoryLimit.of_study(study)
    parity = study.user_attrs.get(PARITY) or {}
    rows = []
    trials = study.get_trials(deepcopy=False)
    requeued_as = {t.user_attrs[REQUEUE_OF]: t.number for t in trials if t.user_attrs.get(REQUEUE_OF) is not None}
    for t in trials:
        ua = t.user_attrs
        cfg = config_of(t)
        rows.append({
            "trial": t.number,
            "state": t.state.name,
            "status": (f"copy of #{ua[DUPLICATE_OF]}" if ua.get(DUPLICATE_OF) is not None
                       else ua.get(STATUS, _UNFINISHED.get(t.state.name, "-"))),
            "samples_per_s": ua.get(MEDIAN),
            # when the workload counts tokens (text): the median of the windows' tokens/s
            "tokens_per_s": statistics.median(ua[TOKENS]) if ua.get(TOKENS) else None,
            "rel_iqr": ua.get(REL_IQR),
            "peak_host_mb": ua.get(PEAK),
            "data_wait_share": ua.get(DATA_WAIT_SHARE),
            "latency_p99_ms": ua.get(LATENCY_P99),  # inference only
            "feasible": is_feasible(t, limit) if t.constraints else None,
            "baseline": bool(ua.get(BASELINE)),
            "role": role(ua, study.user_attrs.get(STUDY_FINGERPRINT)),
            "config": cfg.short() if cfg is not None else "-",
            "reason": _reason(t, limit, parity.get(str(t.number)), requeued_as.get(t.number)),
            "wall_s": ua.get(WALL_S),
        })
    return rows


def role(user_attrs: dict[str, Any], fingerprint: str | None = None) -> str:
    """Why a trial was queued, for `show`: baseline, likely winner, batch walk down/up, a one-knob step or a
    repeat of the planned search, compile tried last, or the earlier study's winner it warm-starts from (its
    name without the ``fingerprint`` every source shares); "" for the sampler's own; a retry says so.

    >>> role({"warm_start_from": "resnet18-train-64px-synthetic-cpu-ab12 #7", "retry_of": 9}, "ab12")
    'warm start: resnet18-train-64px-synthetic-cpu #7, retry of #9'
    """
    ua = user_attrs
    if ua.get(BASELINE):
        what = "baseline"
    elif ua.get(LIKELY_WINNER):
        what = "likely winner"
    elif ua.get(BATCH_LINE):
        what = f"batch walk {'up' if ua[BATCH_LINE] > 0 else 'down'}"
    elif ua.get(WARM_START):
        source = str(ua[WARM_START])
        what = "warm start: " + (source.replace(f"-{fingerprint} #", " #") if fingerprint else source)
    elif ua.get(KNOB_STEP):
        what = f"one knob: {ua[KNOB_STEP]}"
    elif ua.get(REPEAT_OF) is not None:
        what = f"repeat of #{ua[REPEAT_OF]}" + (", by turns" if ua.get(BY_TURNS) is not None else "")
    elif ua.get(COMPILE_LAST):
        what = f"compile last: {ua[COMPILE_LAST]}"
    elif ua.get(PLAN_STEP):
        what = str(ua[PLAN_STEP])
    else:
        what = ""
    if ua.get(RETRY_OF) is not None:
        what += (", " if what else "") + f"retry of #{ua[RETRY_OF]}"
    return what


def _reason(trial: FrozenTrial, limit: MemoryLimit, parity: dict | None, requeued_as: int | None = None) -> str:
    """What `show` says of a trial: its own reason, or why a measured one is not a candidate; first, that it
    was re-queued (a prune far below its neighbours) or is such a re-run, or ran with compile held back."""
    ua = trial.user_attrs
    marks = [f"re-queued as #{requeued_as}" if requeued_as is not None else "",
             f"re-run of pruned #{ua[REQUEUE_OF]}" if ua.get(REQUEUE_OF) is not None else "", ua.get(HELD_BACK) or ""]
    if parity is not None and not parity.get("ok", True):
        own = f"not recommended: {parity.get('reason', 'failed the numerics check')}"
    elif ua.get(STATUS) == "ok" and trial.constraints and not limit.meets_latency(ua.get(LATENCY_P99)):
        p99 = ua.get(LATENCY_P99)
        own = (f"over the latency bound: p99 {p99:.2f} ms > {limit.latency_p99_ms:g} ms" if p99 is not None
               else f"no latency measured, under a {limit.latency_p99_ms:g} ms p99 bound")
    elif ua.get(STATUS) == "ok" and trial.constraints and not is_feasible(trial, limit):
        own = "no room: its peak is over the cap less the memory margin"
    else:
        own = ua.get(REASON, "")
    return "; ".join(m for m in marks + [own] if m)


def window_noise(trials) -> float | None:
    """The median relative IQR of ``trials``' windows (``REL_IQR``); None when none says."""
    from autotune.measure import median_or_none

    return median_or_none([t.user_attrs[REL_IQR] for t in trials
                           if isinstance(t.user_attrs.get(REL_IQR), (int, float))])


def noise_of(trials) -> float:
    """The noise a gain must clear: ``window_noise``, at least ``NOISY_REL_IQR``: the one rule the planned search's
    convergence, compile last and the provisional pick read."""
    from autotune.measure import NOISY_REL_IQR

    return max(NOISY_REL_IQR, window_noise(trials) or 0.0)
