"""The finalists: the time the search leaves them, which of them fit the time left, their interleaved
re-measurement, and the recommendation chosen from it.

A single search trial ranks close configs by luck, so the top configs and the baseline are measured again, interleaved
(A B C, B C A, ...), with longer windows; the winner is picked by median. A config within noise of the fastest and
lighter (memory, then threads, then knobs changed) wins within ``settle.TIE_TOLERANCE`` of the fastest's median where
the rounds can tell that (``settle.blind_tie``); further behind, or not told, the two are measured in more rounds
first (``settle.ExtraRounds``). A winner with reduced precision, channels_last, compile or N DDP ranks must pass the
numerics check (``parity``) first. What the rounds measured is ``finalist_rounds.Evidence``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys
from autotune.config import MeasureSpec, TrialConfig, Workload
from autotune.machine.envstamp import collect_env_stamp
from autotune.machine.launch_env import inherited_env
from autotune.search.choose.finalist_rounds import Evidence, pool_search_round, record_parity, remeasure
from autotune.errors import AutotuneError
from autotune.measure import summarize
from autotune.trial.parity import (CHECK_STARTUP_S, LAYOUT_ONLY, check_seconds, compared_with, first_passing,
                                   needs_parity, world_of)
from autotune.search.choose.contenders import planned_trial
from autotune.search.choose.payback import Priced, RunLength, price
from autotune.search.choose.same_loader import provisional_best
from autotune.search.choose.settle import (TIE_TOLERANCE, blind_tie, lightest, paired_speeds, ratio_interval,
                                           round_ratios, round_spread)
from autotune.search.budget import NUMERICS_SHARE, Budget, confirm_measure
from autotune.search.choose.time_plan import rerun_wall_s
from autotune.provenance import reproduce_command, tokens_per_sample, versions_of
from autotune.recommendation import Recommendation
from autotune.search.record.trials import (MemoryLimit, baseline_trial, baseline_value, feasible_by_config,
                                           noise_of)

if TYPE_CHECKING:
    from optuna import Study
    from optuna.trial import FrozenTrial
    from autotune.machine.hardware import Hardware

__all__ = ["expected_check_s", "best_check_s", "check_steps_within", "MIN_CHECK_STEPS", "plan", "Evidence", "remeasure",
           "pool_search_round", "ratio_interval", "FinalistContext", "choose", "provisional", "settle_ties"]

# The fewest steps a numerics check shortened to fit a budget keeps (fewer say too little): below, no check, said.
MIN_CHECK_STEPS = 10


def check_steps_within(full_s: float, steps: int, *, budget: Budget, log: Callable[[str], None]) -> int:
    """The steps of a numerics check expected to take ``full_s`` at ``steps`` steps that fit its share of the
    ``budget`` (``NUMERICS_SHARE`` of it, at most half the time left): ``steps`` when the whole check fits, fewer
    (at least ``MIN_CHECK_STEPS``) when not, 0 (no check, said) when not even those fit.

    >>> import time
    >>> check_steps_within(40.0, 30, budget=Budget.of(100.0, started=time.monotonic() - 20.0), log=print)
    the numerics check gets 20 of 30 steps: the whole (~40 s) would take more than its share of the budget (30 s)
    20
    """
    if not full_s or not steps or budget.deadline is None:
        return steps
    share = min(NUMERICS_SHARE * (budget.budget_s or math.inf), budget.left_s() / 2)
    if full_s <= share:
        return steps
    per_step = (full_s - CHECK_STARTUP_S) / steps
    fit = int((share - CHECK_STARTUP_S) / per_step) if per_step > 0 else 0
    if fit >= MIN_CHECK_STEPS:
        log(f"the numerics check gets {fit} of {steps} steps: the whole (~{full_s:.0f} s) would take more than its "
            f"share of the budget ({share:.0f} s)")
        return fit
    log(f"no numerics check: even {MIN_CHECK_STEPS} steps would take more than its share of the budget "
        f"({share:.0f} s); a longer --timeout checks it")
    return 0


def best_check_s(study: Study, *, fingerprint: str, limit: MemoryLimit, workload: Workload, steps: int) -> float:
    """The expected time of a numerics check of ``steps`` steps of the best feasible config so far
    (``expected_check_s``); 0 without a check, such a config or a baseline."""
    feasible = feasible_by_config(study, fingerprint, limit)
    if not steps or not feasible:
        return 0.0
    best = max(feasible.values(), key=lambda t: t.value or 0.0)
    return expected_check_s(best, baseline_trial(study), steps=steps, workload=workload)


def expected_check_s(trial: FrozenTrial | None, base, *, steps: int, workload: Workload | None = None) -> float:
    """The expected numerics check of ``trial``'s config of ``workload`` (``parity.check_seconds``), from its
    measured rate and the baseline trial ``base``'s (fp32 eager); 0 when it needs none, or either rate is unknown."""
    if base is None or not base.value or trial is None or not trial.value:
        return 0.0
    return check_seconds(keys.config_of(trial), samples_per_s=trial.value, fp32_samples_per_s=base.value, steps=steps,
                         workload=workload)


# --- who is re-measured, for how many rounds -------------------------------------------------------------

def plan(top: list, base, *, budget: Budget, rounds: int, left_s: float | None,
         log: Callable[[str], None]) -> tuple[list, int] | None:
    """``(candidate trials, rounds)`` to re-measure: ``top`` (best first) and the baseline trial ``base``
    unless it is one of them. With ``left_s`` (seconds left for them) only whole rounds that fit run, each priced
    by the ``budget``'s one estimate (``Budget.round_s``, from the candidates' search trials); None when not even
    one fits (recommend provisionally).

    One round is not a comparison (each config measured once, the very luck re-measuring exists to remove),
    so two rounds come first: the most finalists for which two rounds fit, shrinking in this order: fewer
    finalists (down to the top two), then the baseline is not re-measured (its search figure stands in),
    then only the top one and the baseline. Only when no two rounds fit does one round run (of the most
    finalists it fits), and ``choose`` then pools each finalist's search trial as a second round
    (``pool_search_round``) and says so."""
    base_key = TrialConfig.from_dict(base.user_attrs[keys.CONFIG]).key() if base is not None else None

    def candidates(k: int, with_base: bool = True) -> list:
        cands = list(top[:k])
        plain = with_base and base is not None and all(keys.config_of(t).key() != base_key for t in cands)
        return cands + [base] if plain else cands

    def round_s(cands: list) -> float:  # estimated from the search trials' wall times, a compile cached
        return budget.round_s([rerun_wall_s(t) for t in cands])

    if left_s is None:
        return candidates(len(top)), rounds
    options = [candidates(k) for k in range(len(top), 1, -1)]
    options += [candidates(2, with_base=False)] if len(top) >= 2 else []
    options += [candidates(1)]
    wanted = min(rounds, 2)
    cands = next((c for c in options if wanted * round_s(c) <= left_s), None)
    if cands is None:  # not two rounds of any of them: one round, of the most that fit
        cands = next((c for c in options if round_s(c) <= left_s), options[-1])
    fit = int(left_s // round_s(cands)) if round_s(cands) > 0 else rounds
    if fit < 1:
        pair = [rerun_wall_s(t) for t in (top[0], base) if t is not None]
        confirm_s = budget.round_s(pair, confirm_measure(budget.measure) if budget.measure is not None else None)
        log(f"no time left in the budget to re-measure the finalists (~{round_s(cands):.0f} s a round): "
            "recommending the best search trial, provisional; `autotune run --trials 0` with more time checks it"
            + (f" (a --timeout of {budget.timeout_for_s(round_s(cands), confirm_s, max(pair)) / 60:.0f} min would "
               "re-measure and confirm it)" if budget.budget_s else ""))
        return None
    if cands != options[0] or fit < rounds:
        log(f"the time budget leaves room for {len(cands)} finalist(s) "
            f"({'with' if base in cands else 'without'} the baseline) and {min(fit, rounds)} of {rounds} round(s)"
            + ("; their search trials count as a second round" if min(fit, rounds) == 1 and len(cands) > 1 else ""))
    return cands, min(rounds, fit)


# --- the choice ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FinalistContext:
    """What ``finalists.choose`` reads: the run's workload, machine, measurement and memory limit, where the study
    and its files are, the planned run (compile is priced over it), the numerics check (``parity_steps`` 0: none,
    ``numerics_cut``: cut to none by the budget, said; ``parity``: the check, None for ``parity.parity_check``)."""

    workload: Workload
    hardware: Hardware
    measure: MeasureSpec
    limit: MemoryLimit
    study_name: str
    storage_url: str
    artifacts_dir: Path
    compile_cache_dir: Path
    run_length: RunLength
    parity_steps: int
    parity: Callable[..., Any] | None
    log: Callable[[str], None]
    numerics_cut: bool = False


@dataclass(frozen=True, slots=True)
class Scored:
    """A finalist that qualified: its config, its search trial, the summary of its rounds, its host peak. Read by
    field name only: a record, not a tuple, so a position is an error rather than another field."""

    config: TrialConfig
    trial: Any
    summary: Any
    peak_mb: float


def _memory_out(limit, c: TrialConfig, ev: Evidence) -> list[str]:
    """Why ``c`` is out on memory: it ran, but without the margin to spare (host, then device); [] if it is not."""
    from autotune._units import format_mb

    why, usable, alloc = [], limit.usable_mb, ev.device_allocated.get(c.key())
    if usable is not None and ev.peaks[c.key()] > usable:
        why.append(f"peak {format_mb(ev.peaks[c.key()])} over the {format_mb(usable)} the "
                   f"{100 * limit.margin:.0f}% margin leaves of the cap")
    if (limit.device_constraint(ev.device_peaks[c.key()], alloc) or 0.0) > 0:
        why.append(f"device peak {format_mb(alloc or ev.device_peaks[c.key()])} over the "
                   f"{100 * (1 - limit.margin):.0f}% of the {format_mb(limit.device_mb)} device memory cap the margin "
                   "leaves")
    return why


def _qualified(limit, configs: list[TrialConfig], trials: list, ev: Evidence,
               notes: list[str]) -> tuple[list[Scored], list[tuple]]:
    """The finalists that finished every round with the margin to spare (``Scored``), and those that are out
    (config, trial), each out with a note saying why. One left out of the later rounds (``Evidence.left_out``: a
    round of all did not fit the time left) is out too, unless none measured in them qualifies: then those left
    out are judged on the rounds they ran, and a note says so."""
    for c in configs:
        ev.failures[c.key()] += _memory_out(limit, c, ev)
    ok = [(c, t) for c, t in zip(configs, trials) if not ev.failures[c.key()] and ev.rounds[c.key()]]
    if ok and all(c.key() in ev.left_out for c, _ in ok):
        notes.append("none of the finalists of the later rounds qualified: "
                     + ", ".join(c.short() for c, _ in ok) + " judged on the rounds before they were left out")
        ev.left_out = {}
    out = [(c, t) for c, t in zip(configs, trials) if ev.failures[c.key()] or c.key() in ev.left_out]
    notes += [f"{c.short()} (trial {t.number}) is out: {ev.why_out(c.key())}" for c, t in out]
    return [Scored(c, t, summarize(ev.samples(c.key())), ev.peaks[c.key()]) for c, t in ok
            if c.key() not in ev.left_out], out


def _numerics_pass(ctx: FinalistContext, study: Study, chosen: Scored, scored: list[Scored], base_trial, ev: Evidence,
                   notes: list[str]) -> tuple[int | None, list[Scored], Any, int]:
    """Check the chosen config's numerics, then the next best's while one fails (``parity.first_passing``):
    (the index in the ranking of the one that passed, or None; the ranking; its parity result; how many were
    checked)."""
    ranked = [chosen] + [x for x in scored if x is not chosen]
    index, checked = _check_numerics(ctx, ranked, base_trial)
    for (config, result), x in zip(checked, ranked):
        if result.steps:  # checked in a child (an fp32 eager config passes without one)
            record_parity(study, x.trial.number, result)
            notes.append(result.note(f"{config.short()} (trial {x.trial.number})"))
        if not result.ok and result.checked:
            ev.failures[config.key()].append(f"numerics: {result.reason}")
    return index, ranked, (checked[index][1] if index is not None else None), len(checked)


def _baseline_median(base_trial, ev: Evidence, notes: list[str]) -> float | None:
    """The baseline's median from its finalist rounds (even if it is out), else from its search trial."""
    base_key = TrialConfig.from_dict(base_trial.user_attrs[keys.CONFIG]).key() if base_trial is not None else None
    base_xs = ev.samples(base_key) if ev.rounds.get(base_key) else None
    if base_trial is not None and not base_xs and base_trial.user_attrs.get(keys.SAMPLES):
        base_xs = base_trial.user_attrs[keys.SAMPLES]  # its search trial stands in
        why = ("its finalist rounds did not all finish" if ev.failures.get(base_key)
               else "not re-measured: the time budget was short")
        notes.append(f"baseline figure from its search trial #{base_trial.number} ({why}), so the speedup is "
                     "less certain")
    return summarize(base_xs).median if base_xs else None


def _spread(configs: list[TrialConfig], ev: Evidence) -> dict | None:
    """How far one paired round's log ratio strays, from the finalists' rounds of those that finished them all
    (``settle.round_spread``): the noise estimate the confirmation plans its rounds by, kept in ``selection``."""
    got = round_spread([ev.rounds[c.key()] for c in configs  # of those measured in every round
                        if ev.rounds[c.key()] and not ev.failures[c.key()] and c.key() not in ev.left_out])
    return None if got is None else {"round_spread": round(got[0], 5), "round_spread_df": got[1]}


def _speedup(chosen: Scored, base_trial, ev: Evidence, base_med: float | None) -> float | None:
    """The selection's speedup of ``chosen`` over the baseline: paired over the rounds both ran
    (``ratio_interval``), else (the baseline not re-measured, or out) its median over the baseline's figure."""
    base_key = keys.config_of(base_trial).key() if base_trial is not None else None
    # paired where the baseline finished each round it ran (a lost round mis-pairs the rest; a prefix pairs as it is)
    if base_key is not None and ev.rounds.get(base_key) and not ev.failures.get(base_key) and ev.rounds.get(
            chosen.config.key()):
        return round(ratio_interval(ev.rounds[chosen.config.key()], ev.rounds[base_key])[0], 3)
    return None if not base_med else round(chosen.summary.median / base_med, 3)


def settle_ties(ctx: FinalistContext, study: Study, scored: list[Scored], out: list, ev: Evidence, notes: list[str],
            more: Callable[..., bool] | None) -> tuple[Scored, Scored, dict, Any] | None:
    """``(the fastest, the chosen, each one's rounds priced, the pricing)`` among ``scored`` (sorted fastest first,
    in place; one put out by an extra round moves to ``out``); None if none is left. See ``choose``."""
    # compile priced over the planned run: every comparison below is of effective throughput (``payback``)
    extra = 0
    while True:
        # each config's speed from its rounds paired with the others' (``settle.paired_speeds``), not pooled windows
        raw = paired_speeds({x.config.key(): ev.rounds[x.config.key()] for x in scored})
        pricing = price([Priced(x.config.key(), x.config.short(), raw[x.config.key()], x.config.batch_size,
                                *_compile_times(study, x.config, x.trial, ev)) for x in scored], ctx.run_length)
        speed = {x.config.key(): raw[x.config.key()] * pricing.factor[x.config.key()] for x in scored}
        scored.sort(key=lambda x: -speed[x.config.key()])
        best, b = scored[0], scored[0].config.key()
        rounds = {k: [[v * pricing.factor[k] for v in r] for r in ev.rounds[k]]
                  for k in (x.config.key() for x in scored)}
        # within noise of the top: less memory, fewer cores busy, then fewer knobs changed from PyTorch's defaults
        close = [best] + [x for x in scored[1:] if ratio_interval(rounds[b], rounds[x.config.key()])[1] <= 1.0]
        chosen = lightest(close, ev.device_peaks)
        gap = speed[b] / speed[chosen.config.key()] - 1
        blind = chosen is not best and blind_tie(rounds[b], rounds[chosen.config.key()], gap,
                                                 (best.config.short(), chosen.config.short()))
        if chosen is best or (gap <= TIE_TOLERANCE and not blind):  # a tie the rounds cannot tell: more rounds first
            break
        why = blind or (f"{best.config.short()} measures {100 * gap:.1f}% ahead of the lighter "
                        f"{chosen.config.short()}, within noise")
        if more is None or not more(ev, best.config, chosen.config, why, max(gap, TIE_TOLERANCE)):
            # the rounds are spent: a lighter config wins within the tolerance (its expected cost), else the faster
            lighter, chosen = chosen, lightest([x for x in close if speed[b] / speed[x.config.key()] - 1
                                                <= TIE_TOLERANCE], ev.device_peaks)
            paired = len(round_ratios(rounds[b], rounds[lighter.config.key()]))
            notes += [] if chosen is not best else [
                f"{best.config.short()} kept over the lighter {lighter.config.short()}: {100 * gap:.1f}% ahead, paired "
                f"over {paired} rounds, within noise; a lighter config wins a tie only within "
                f"{100 * TIE_TOLERANCE:g}% of the fastest"]
            break
        extra += 1
        for x in (best, chosen):  # an extra round can put either out, as any round can
            ev.failures[x.config.key()] += _memory_out(ctx.limit, x.config, ev)
            if ev.failures[x.config.key()]:
                scored.remove(x)
                out.append((x.config, x.trial))
                notes.append(f"{x.config.short()} (trial {x.trial.number}) is out: "
                             f"{'; '.join(ev.failures[x.config.key()])}")
        scored[:] = [dataclasses.replace(x, summary=summarize(ev.samples(x.config.key())),
                                         peak_mb=ev.peaks[x.config.key()]) for x in scored]
        if not scored:
            return None
    notes += pricing.notes
    if extra:
        notes.append(f"{extra} extra finalist round(s) of the two configs in dispute settled the choice")
    return best, chosen, rounds, pricing


def choose(ctx: FinalistContext, study: Study, configs: list[TrialConfig], trials: list[FrozenTrial], ev: Evidence,
           base_trial: FrozenTrial | None, *, check_numerics: bool = True,
           more: Callable[..., bool] | None = None) -> Recommendation | None:
    """The recommendation from the finalists' rounds; None when none of them qualified (each failed a round,
    left too little memory, or failed the numerics check).

    A finalist that failed any round (out of memory, over the cap or the margin, timed out, crashed) is out,
    whatever its other rounds measured, and the recommendation's notes say so. The fastest by median wins, unless
    another is within noise of it and lighter (device memory, then host, each by more than ``settle.MEMORY_TIE`` and
    ``MEMORY_TIE_MB``, then threads, then knobs changed from PyTorch's defaults: ``settle.lightest``) and its median
    within ``TIE_TOLERANCE`` of the fastest's: "within noise" means the 95% interval of the ratio of their medians
    over the interleaved rounds (``ratio_interval``) includes 1, not that their windows spread widely. A lighter
    config within noise but further behind (or within it, where the rounds cannot tell: ``settle.blind_tie``) is
    measured against the fastest in more rounds while ``more(ev, fastest, lighter, why, gap)`` runs one
    (``settle.ExtraRounds``); when it runs none, the fastest by median wins (the lighter within the tolerance). Then the
    numerics guard: a winner with bf16/fp16 or compile must train like fp32 eager (``parity.parity_check``, in a
    child), else the next best (one fp32 eager process passes)."""
    notes: list[str] = []
    limit = ctx.limit
    scored, out = _qualified(limit, configs, trials, ev, notes)
    if not scored:
        return None
    if ev.rounds_run == 1 and len(configs) > 1:
        notes.append("one finalist round only (the time budget or --rounds left no second): "
                     + ("each finalist's search trial counts as a second round; it was not interleaved and it is "
                        "the round that picked them, so the margin is less certain than two interleaved rounds'"
                        if ev.pooled else "the choice rests on one measurement of each")
                     + "; a longer --timeout gives two")
    picked = settle_ties(ctx, study, scored, out, ev, notes, more)
    if picked is None:
        return None
    best, chosen, rounds, pricing = picked
    tied = chosen is not best  # won a tie on memory/threads
    parity = None
    if ctx.parity_steps and not check_numerics:
        notes.append("numerics not checked against fp32 eager: the trials ran on machines unlike this one")
    elif ctx.numerics_cut and needs_parity(chosen.config, world_size=world_of(ctx.workload)):
        notes.append("numerics not checked against fp32 eager: the budget left no time for the check (a longer "
                     "--timeout checks it)")
    elif ctx.parity_steps:  # reduced precision and compile change the arithmetic: check it
        index, ranked, parity, n_checked = _numerics_pass(ctx, study, chosen, scored, base_trial, ev, notes)
        failed = ranked[:n_checked - 1] if index is not None else ranked
        scored = [x for x in scored if x not in failed]
        out += [(x.config, x.trial) for x in failed]
        if index is None:
            return None
        chosen = ranked[index]
        tied = tied and index == 0
    if ctx.parity_steps and check_numerics and not ctx.numerics_cut and chosen.config.channels_last and \
            not needs_parity(chosen.config, world_size=world_of(ctx.workload)):  # the shortcut, said (issue 50)
        notes.append(f"numerics not checked: {LAYOUT_ONLY.split(': ', 1)[1]}")
    if tied:
        apart, lo, hi = ratio_interval(rounds[best.config.key()], rounds[chosen.config.key()])
        between = (f"95% interval {100 * (lo - 1):+.1f}% to {100 * (hi - 1):+.1f}%" if math.isfinite(hi)
                   else "one round: no interval")
        notes.append(f"{chosen.config.short()} chosen over {best.config.short()}: within noise "
                     f"({100 * (apart - 1):.1f}% apart, {between}) and lighter on memory/threads or knobs")
    others = [x for x in scored if x is not chosen]
    margin = interval = None
    if others:
        ratio, lo, hi = ratio_interval(rounds[chosen.config.key()], rounds[others[0].config.key()])
        margin = ratio - 1
        interval = (round(lo - 1, 4), round(hi - 1, 4)) if math.isfinite(hi) else None  # one round: none
    base_med = _baseline_median(base_trial, ev, notes)
    speedup = _speedup(chosen, base_trial, ev, base_med)
    s = chosen.summary
    if s.noisy:
        notes.append(f"noisy: IQR {100 * s.rel_iqr:.1f}% of the median")
    hw = ctx.hardware
    return Recommendation(
        config=chosen.config, workload=ctx.workload,
        median_samples_per_s=round(s.median, 3), iqr_samples_per_s=round(s.iqr, 3),
        samples_per_s=tuple(round(x, 3) for x in ev.samples(chosen.config.key())),
        baseline_samples_per_s=None if base_med is None else round(base_med, 3),
        speedup_vs_baseline=speedup,
        peak_host_mb=round(chosen.peak_mb, 1) or None, memory_cap_mb=ctx.measure.memory_cap_mb,
        memory_margin=limit.margin, peak_device_mb=ev.device_peaks[chosen.config.key()],
        peak_device_allocated_mb=ev.device_allocated.get(chosen.config.key()), device_memory_cap_mb=limit.device_mb,
        margin_vs_runner_up=None if margin is None else round(margin, 4), margin_interval=interval, noisy=s.noisy,
        hardware={"summary": hw.summary_line(), "cpu": hw.cpu_model, "usable_cores": hw.usable_cores,
                  "ram_total_mb": round(hw.ram_total_mb), "gpus": list(hw.gpus)},
        fingerprint=hw.fingerprint, versions=versions_of(hw), env_stamp=collect_env_stamp(), shell_env=inherited_env(),
        study_name=ctx.study_name,
        storage=ctx.storage_url, trial_number=chosen.trial.number,
        runners_up=tuple([{"config": x.config.to_dict(), "short": x.config.short(),
                           "median_samples_per_s": round(x.summary.median, 3),
                           "iqr_samples_per_s": round(x.summary.iqr, 3),
                           "trial": x.trial.number} for x in others]
                         + [{"config": c.to_dict(), "short": c.short(), "trial": t.number,
                             "out": ev.why_out(c.key())} for c, t in out]),
        notes=tuple(notes), reproduce=reproduce_command(ctx.workload, chosen.config, ctx.measure.memory_cap_mb),
        parity=None if parity is None or not parity.steps else parity.to_dict(),
        finalist_rounds=ev.rounds_run, search_round_pooled=ev.pooled,
        user_parts=tuple(chosen.trial.user_attrs.get(keys.USER_PARTS) or ()),
        compile={**pricing.record, "cache_dir": str(ctx.compile_cache_dir)}, selection=_spread(configs, ev),
        tokens_per_sample=tokens_per_sample(*(t.user_attrs for t in trials if t is not None)),
    )


def _check_numerics(ctx: FinalistContext, ranked: list, base_trial) -> tuple[int | None, list]:
    """``parity.first_passing`` over ``ranked`` (best first), announced; its child runs under the trials' cap."""
    expect = expected_check_s(ranked[0].trial, base_trial, steps=ctx.parity_steps, workload=ctx.workload)
    if expect:
        ctx.log(f"checking the numerics of {ranked[0].config.short()} {compared_with(ctx.workload)} "
                f"({ctx.parity_steps} steps each of it, the reference and a control, in a child): ~{expect:.0f} s "
                "expected")
    return first_passing([x.config for x in ranked], ctx.workload, check=ctx.parity, steps=ctx.parity_steps,
                         log_path=ctx.artifacts_dir / "parity.log", memory_cap_mb=ctx.measure.memory_cap_mb)


def _compile_times(study: Study, config: TrialConfig, trial: FrozenTrial,
                   ev: Evidence) -> tuple[float | None, float | None]:
    """``(cold, cached)`` compile seconds of a compiled finalist, (None, None) for an eager one. Cold: the
    longest compile measured for its graph in the study (its own trial and rounds, and every trial with the
    same compile mode, batch size, amp and channels_last, whatever its loader knobs): what a fresh process
    pays; cached: the shortest, what a process that finds the study's inductor cache pays."""
    if config.compile_mode == "none":
        return None, None
    graph = (config.compile_mode, config.batch_size, config.amp, config.channels_last)
    seen = list(ev.compile_s.get(config.key(), [])) + [trial.user_attrs.get(keys.COMPILE_S)]
    for t in study.get_trials(deepcopy=False):
        c = t.user_attrs.get(keys.CONFIG)
        if c and (c.get("compile_mode"), c.get("batch_size"), c.get("amp"), c.get("channels_last")) == graph:
            seen.append(t.user_attrs.get(keys.COMPILE_S))
    seen = [x for x in seen if isinstance(x, (int, float))]
    if not seen:  # not measured (a study from before compile_s was): priced as free, said in the YAML row
        return 0.0, None
    return max(seen), (min(seen) if len(seen) > 1 else None)


def provisional(study: Study, *, storage: str = "") -> Recommendation:
    """The best feasible trial as a recommendation, flagged provisional: its finalists were not re-measured (the run
    was stopped before the end, or the budget left no time for them). Where the planned search kept a config as its
    best (``keys.PLAN_KEPT``), it is recommended over a faster one within the noise of it (the windows' median spread,
    at least ``NOISY_REL_IQR``; over all of each config's measurements, ``config_level``, not its luckiest: on
    2026-11-29 a repeat the plan had judged "not shown" won on its luckier trial), unless ``same_loader`` picked by the
    pipeline already: the plan kept no knob on a gain that small (it re-measured it, or would have), and the fastest
    of many single trials is the luckiest as often as the best (issue 50: inter-op threads 1, +5.3% once, +3.6% over
    two rounds with an interval through 0, was recommended over the config the plan kept)."""
    checks = study.user_attrs.get(keys.PARITY) or {}
    feasible = {k: t for k, t in feasible_by_config(study).items()
                if (checks.get(str(t.number)) or {}).get("ok", True)}  # not one that failed the numerics check
    if not feasible:
        raise AutotuneError(f"study {study.study_name!r} has no finished feasible trial yet: run "
                            "`autotune run` longer, or see `autotune show` for why trials failed")
    workload = Workload.from_dict(study.user_attrs[keys.STUDY_WORKLOAD])
    # the fastest, or on its loader one that waited for data within the noise of it (a GPU's pipeline)
    best, passed_over = provisional_best(feasible.values(), device=workload.device_family)
    kept = planned_trial(study, feasible) if not passed_over else None
    noise, level = noise_of(study.get_trials(deepcopy=False)), lambda t: keys.config_level(study, t)
    if kept is not None and kept is not best and kept.value and level(best) <= level(kept) * (1 + noise):
        passed_over = (f"the planned search's best config (trial {kept.number}) is recommended over the fastest search "
                       f"trial (trial {best.number}, {100 * (level(best) / level(kept) - 1):+.1f}% over all their "
                       f"measurements): within the noise ({noise:.0%}) of it")
        best = kept
    ua = best.user_attrs
    xs = ua.get(keys.SAMPLES) or [best.value]
    s = summarize(xs)
    base = baseline_value(study)
    # one search trial each, unpaired: no claim, so no ``speedup_vs_baseline`` (issue 52, item 3); the note keeps it
    ratio = (f"its search trial ran x{s.median / base:.2f} of the baseline's search trial: one trial each, not "
             "paired, so no claim" if base else "")
    config = TrialConfig.from_dict(ua[keys.CONFIG])
    space: dict[str, Any] = study.user_attrs.get(keys.STUDY_SPACE) or {}
    limit = keys.MemoryLimit.of_study(study)
    cap = limit.cap_mb
    return Recommendation(
        config=config, workload=workload, median_samples_per_s=round(s.median, 3),
        iqr_samples_per_s=round(s.iqr, 3), samples_per_s=tuple(xs), baseline_samples_per_s=base,
        speedup_vs_baseline=None, peak_host_mb=ua.get(keys.PEAK),
        memory_cap_mb=cap, memory_margin=limit.margin, peak_device_mb=ua.get(keys.PEAK_DEVICE),
        peak_device_allocated_mb=ua.get(keys.PEAK_DEVICE_ALLOCATED), device_memory_cap_mb=limit.device_mb,
        margin_vs_runner_up=None, noisy=s.noisy,
        hardware={"summary": study.user_attrs.get(keys.STUDY_HARDWARE), "usable_cores": space.get("usable_cores")},
        fingerprint=study.user_attrs.get(keys.STUDY_FINGERPRINT, ""), versions=versions_of(None),
        env_stamp=collect_env_stamp(), shell_env=inherited_env(),
        study_name=study.study_name, storage=storage, trial_number=best.number,
        notes=("provisional: the best search trial, not re-measured against the runners-up; "
               "finish a run (or `autotune run --trials 0`) for a checked recommendation",)
        + ((ratio,) if ratio else ()) + ((passed_over,) if passed_over else ()),
        reproduce=reproduce_command(workload, config, cap), provisional=True,
        user_parts=tuple(ua.get(keys.USER_PARTS) or ()),
        tokens_per_sample=tokens_per_sample(*(t.user_attrs for t in feasible.values())),
    )
