"""What a stored study says: the attribute keys trials carry, the one outcome mapping, read-only queries.

The tuner's modules read and write the attributes that carry the protocol through the key constants below
(as Optuna names ``_CONSTRAINTS_KEY``), so such a key is spelled once; report.py and diagnose.py still read
a few by their literal names. User attributes are flat so optuna-dashboard shows them as
columns; the figures a measured trial stores are ``TrialResult.figures()``'s keys.

``outcome`` decides what a ``TrialResult`` means to Optuna, once: ok -> COMPLETE with the memory constraint;
out of memory, over the cap or known to be -> COMPLETE but infeasible (so the sampler learns the boundary;
a FAIL would be ignored and re-proposed); pruned or timed out -> PRUNED; anything else -> FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import MEMORY_STATUSES, TrialConfig, TrialResult

__all__ = ["Outcome", "outcome", "is_feasible", "feasible_by_config", "known", "baseline_trial", "baseline_value",
           "baseline_trial_any", "trial_rows", "config_of", "ROLES", "OWN_ATTRS"]

# --- user attributes of a trial -------------------------------------------------------------------------
CONFIG = "config"                # the TrialConfig that ran (to_dict)
QUEUED_CONFIG = "queued_config"  # the TrialConfig a queued trial will run, so `show` can say it
FINGERPRINT = "fingerprint"      # the hardware fingerprint of the machine that measured it
STATUS = "status"                # TrialResult.status, or "interrupted"
REASON = "reason"                # one line a person reads
WALL_S = "wall_s"
BASELINE = "baseline"            # roles a trial is queued with, kept by its retry
LIKELY_WINNER = "likely_winner"
BATCH_LINE = "batch_line"        # -1 / +1: a step of the batch-size walk down / up
RETRY_OF = "retry_of"            # the number of the interrupted trial this one repeats
DUPLICATE_OF = "duplicate_of"    # the number of the trial whose figures this one copies
WAITED_FOR = "waited_for"        # the number of the trial (another worker's) this one waited for
BOTTLENECK = "bottleneck"
TRACEBACK = "traceback"
NODE = "node"                    # the Ray node that ran it

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
STUDY_MEASURE = "measure"
STUDY_RECOMMENDATION = "recommendation"
WALK_ANCHOR = "batch_walk_anchor"

# A queued trial's role in the study, kept by its retry.
ROLES = (BASELINE, LIKELY_WINNER, BATCH_LINE)

# A trial's own attributes, which a copy of its figures (a duplicate config) does not take over.
OWN_ATTRS = ROLES + (CONFIG, QUEUED_CONFIG, RETRY_OF, DUPLICATE_OF, WAITED_FOR, REASON, WALL_S)

# what `show` says of a trial that has no result yet
_UNFINISHED = {"RUNNING": "running", "WAITING": "queued"}


@dataclass(frozen=True)
class Outcome:
    state: str  # "complete" | "pruned" | "fail"
    value: float | None = None
    memory_constraint: float | None = None  # <= 0 feasible


def outcome(result: TrialResult, memory_cap_mb: float | None) -> Outcome:
    """Map a TrialResult to what Optuna records: decided here, once.

    ok -> COMPLETE, value = median samples/s, memory constraint = peak/cap - 1 (<= 0, feasible).
    oom / over_memory / skipped -> COMPLETE but infeasible (constraint > 0): the sampler learns the boundary
    and does not propose it again (a FAIL would be ignored and re-proposed). pruned / timeout -> PRUNED.
    crashed / error -> FAIL, with the reason kept in the trial's attributes.
    """
    if result.status == "ok":
        c = (result.peak_host_mb / memory_cap_mb - 1.0) if (result.peak_host_mb and memory_cap_mb) else -1.0
        return Outcome("complete", float(result.median_samples_per_s or 0.0), min(c, 0.0))
    if result.status in MEMORY_STATUSES or result.status == "skipped":
        over = (result.peak_host_mb / memory_cap_mb - 1.0) if (result.peak_host_mb and memory_cap_mb) else 0.0
        return Outcome("complete", 0.0, max(over, 1.0 if over <= 0 else over))
    if result.status in ("pruned", "timeout"):
        return Outcome("pruned")
    return Outcome("fail")


def is_feasible(trial) -> bool:
    """Every constraint the trial recorded is met (a trial with none is feasible)."""
    return all(c <= 0 for c in trial.constraints.values())


def config_of(trial, space=None) -> TrialConfig | None:
    """The config a trial ran; for a queued trial, the one it will run (from ``space`` and its fixed params,
    else from what was recorded when it was queued); None when neither is known."""
    ua = trial.user_attrs
    if ua.get(CONFIG):
        return TrialConfig.from_dict(ua[CONFIG])
    fixed = trial.system_attrs.get(FIXED_PARAMS)
    if space is not None and fixed:
        return space.effective(fixed)
    return TrialConfig.from_dict(ua[QUEUED_CONFIG]) if ua.get(QUEUED_CONFIG) else None


def feasible_by_config(study, fingerprint: str | None = None) -> dict[tuple, Any]:
    """Best measured (status ok) feasible trial per distinct config, among the trials measured on hardware
    ``fingerprint`` (default: the study's): a Ray cluster may mix kinds of nodes, a recommendation may not."""
    from optuna.trial import TrialState

    fingerprint = fingerprint or study.user_attrs.get(STUDY_FINGERPRINT)
    out: dict[tuple, Any] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(STATUS) != "ok" or t.user_attrs.get(DUPLICATE_OF) is not None:
            continue
        if fingerprint and t.user_attrs.get(FINGERPRINT, fingerprint) != fingerprint:
            continue
        if not is_feasible(t):
            continue
        key = TrialConfig.from_dict(t.user_attrs[CONFIG]).key()
        if key not in out or (t.value or 0) > (out[key].value or 0):
            out[key] = t
    return out


def known(study, fingerprint: str) -> tuple[dict[tuple, Any], list[tuple[TrialConfig, int]]]:
    """Finished (complete or pruned) measured trials of this hardware by config key, and the memory failures
    among them as (config, trial number). Copies and other machines' trials are not evidence."""
    from optuna.trial import TrialState

    done: dict[tuple, Any] = {}
    memory_failures: list[tuple[TrialConfig, int]] = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        cfg = t.user_attrs.get(CONFIG)
        if not cfg or t.user_attrs.get(DUPLICATE_OF) is not None:
            continue
        if t.user_attrs.get(FINGERPRINT, fingerprint) != fingerprint:
            continue  # measured on another kind of machine (a Ray node): not evidence about this one
        c = TrialConfig.from_dict(cfg)
        done.setdefault(c.key(), t)
        if t.user_attrs.get(STATUS) in MEMORY_STATUSES:
            memory_failures.append((c, t.number))
    return done, memory_failures


def baseline_trial(study):
    """The measured (status ok) baseline trial, or None."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(BASELINE) and t.user_attrs.get(STATUS) == "ok":
            return t
    return None


def baseline_value(study) -> float | None:
    t = baseline_trial(study)
    return t.value if t is not None else None


def baseline_trial_any(study):
    """The baseline trial in any state (queued, running, finished), or None."""
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get(BASELINE):
            return t
    return None


def trial_rows(study) -> list[dict[str, Any]]:
    """One flat dict per trial (for `show`, CSV, reports), from what the trials stored."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        ua = t.user_attrs
        cfg = config_of(t)
        rows.append({
            "trial": t.number,
            "state": t.state.name,
            "status": (f"copy of #{ua[DUPLICATE_OF]}" if ua.get(DUPLICATE_OF) is not None
                       else ua.get(STATUS, _UNFINISHED.get(t.state.name, "-"))),
            "samples_per_s": ua.get("median_samples_per_s"),
            "rel_iqr": ua.get("rel_iqr"),
            "peak_host_mb": ua.get("peak_host_mb"),
            "data_wait_share": ua.get("data_wait_share"),
            "feasible": is_feasible(t) if t.constraints else None,
            "baseline": bool(ua.get(BASELINE)),
            "config": cfg.short() if cfg is not None else "-",
            "reason": ua.get(REASON, ""),
            "wall_s": ua.get(WALL_S),
        })
    return rows
