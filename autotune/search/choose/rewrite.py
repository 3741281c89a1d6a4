"""The recommendation rewritten with its confirmed claim (``apply``): the claim's figures are the confirmation's
rounds' (``confirm``), the figures of the selection that chose it kept apart (``selection_record``).

A recommendation states no figure the confirmation did not measure: when it failed (a run out of memory, crashed or
timed out, or no round fitted) or ran one round only (no interval: no claim), the samples/s, baseline and speedup
are left empty, the selection's kept in ``selection``. A winner the confirmation measured slower than the baseline
beyond the noise (and not noisy itself) is not recommended: the baseline is, with every figure its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from autotune.measure import summarize
from autotune.search.choose.confirmation import Confirmation

__all__ = ["apply", "selection_record"]


def selection_record(rec: Any) -> dict[str, Any]:
    """What chose the recommendation, kept apart from the claim: the finalists' figures and rounds."""
    return {**(rec.selection or {}),  # what the finalists kept there (their rounds' spread, ``finalists.choose``)
            "median_samples_per_s": rec.median_samples_per_s, "iqr_samples_per_s": rec.iqr_samples_per_s,
            "samples_per_s": list(rec.samples_per_s), "baseline_samples_per_s": rec.baseline_samples_per_s,
            "speedup_vs_baseline": rec.speedup_vs_baseline, "finalist_rounds": rec.finalist_rounds,
            "search_round_pooled": rec.search_round_pooled, "trial": rec.trial_number,
            "margin_vs_runner_up": rec.margin_vs_runner_up,
            "margin_interval": list(rec.margin_interval) if rec.margin_interval else None}


def apply(rec: Any, conf: Confirmation, baseline: Any, *, reproduce: Callable[[Any], str] | None = None,
          base_figures: dict | None = None) -> Any:
    """``rec`` (a Recommendation) with its claim from ``conf``: the confirmed samples/s, baseline and speedup, the
    selection's own figures kept apart; when the confirmation saw the winner slower than the baseline beyond the
    noise, the baseline's config is recommended instead, with both figures said, and every figure of the record
    is the baseline's (its windows from the confirmation, its peaks from ``base_figures``, its search trial's user
    attributes) or left out, never the winner's."""
    selection = selection_record(rec)
    notes = list(rec.notes)
    record = {**conf.to_dict(), "baseline_config": baseline.to_dict()}  # what the claim is against
    # no figure the confirmation did not measure, nor one round's (no interval: no claim); the selection's stay in
    # ``selection``, the round's ratio in the confirmation record (``one_round_ratio``), the claim line says why
    if conf.ratio is None or conf.status == "unconfirmed":
        return dataclasses.replace(rec, median_samples_per_s=None, iqr_samples_per_s=None, samples_per_s=(),
                                   baseline_samples_per_s=None, speedup_vs_baseline=None, noisy=False,
                                   selection=selection, confirmation=record,
                                   notes=tuple(notes + [f"claim {conf.headline()}"]))
    winner_med, base_med = conf.winner_median, conf.baseline_median
    sel = rec.speedup_vs_baseline
    # the selection's stand-in for the baseline is the selection's only: the claim's baseline ran in these rounds
    notes = [n + "; the claim's baseline is the confirmation's own rounds" if n.startswith("baseline figure from its "
             "search trial") else n for n in notes]
    if sel and conf.high is not None and conf.high < sel and conf.status == "confirmed":
        notes.append(f"the selection measured x{sel:.2f}; rounds that did not choose it measure x{conf.ratio:.2f}: "
                     "the claim is theirs (the selection's luck is left out)")
    # the claim's figures are the confirmation's, its windows too (the selection's are kept in ``selection``)
    won = tuple(x for r in conf.rounds for x in r["winner"])
    spread = summarize(won)
    out = dataclasses.replace(rec, median_samples_per_s=round(winner_med, 3), samples_per_s=won,
                              iqr_samples_per_s=round(spread.iqr, 3), noisy=spread.noisy,
                              baseline_samples_per_s=round(base_med, 3), speedup_vs_baseline=round(conf.ratio, 3),
                              selection=selection, confirmation=record, notes=tuple(notes))
    # slower beyond the noise, and the confirmation not itself noisy (a +/-70% interval on a busy VM says nothing the
    # selection's rounds did not): the defaults stand
    if conf.status == "confirmed" and conf.high is not None and conf.high < 1 and not conf.noisy:
        from autotune.search.record import trials as keys

        ua, windows = base_figures or {}, tuple(x for r in conf.rounds for x in r["baseline"])
        out = dataclasses.replace(
            out, config=baseline, trial_number=None, speedup_vs_baseline=1.0, median_samples_per_s=round(base_med, 3),
            samples_per_s=windows, iqr_samples_per_s=round(summarize(windows).iqr, 3), noisy=summarize(windows).noisy,
            peak_host_mb=ua.get(keys.PEAK), peak_device_mb=ua.get(keys.PEAK_DEVICE),
            peak_device_allocated_mb=ua.get(keys.PEAK_DEVICE_ALLOCATED), margin_vs_runner_up=None,
            margin_interval=None, worst_case=None, latency_ms=None,
            reproduce=reproduce(baseline) if reproduce is not None else "", parity=None, compile=None,
            notes=out.notes + (f"{rec.config.short()} won the selection{f' (x{sel:.2f})' if sel else ''} but ran "
                               "slower than the "
                               f"baseline in the confirmation ({conf.headline()}): PyTorch's defaults are "
                               "recommended",))
        return out
    return dataclasses.replace(out, notes=out.notes + tuple(_runner_up_above(rec, conf, baseline)))


def _runner_up_above(rec: Any, conf: Confirmation, baseline: Any) -> list[str]:
    """A note when a runner-up's speedup in the selection (its finalist rounds' median over the baseline's there) is
    above the winner's confirmation interval: the evidence of the two disagrees, and the line says so. The baseline
    among the runners-up is not one (its own speedup is 1 by definition)."""
    from autotune.config import TrialConfig

    base = rec.baseline_samples_per_s  # the selection's, before the claim replaces it
    if conf.status != "confirmed" or conf.high is None or not base:
        return []
    for ru in rec.runners_up:
        m = ru.get("median_samples_per_s")
        if ru.get("config") and TrialConfig.from_dict(ru["config"]).key() == baseline.key():
            continue
        if m and m / base > conf.high:
            return [f"the runner-up {ru.get('short', '?')} measured x{m / base:.2f} over the baseline in the "
                    f"selection, above the confirmation's interval of {rec.config.short()} (x{conf.low:.2f} to "
                    f"x{conf.high:.2f}): the evidence of the two disagrees; the recommendation stays the selection's "
                    "choice, its claim the confirmation's (more finalist rounds settle it)"]
    return []


def numerics_unchecked(rec: Any) -> Any:
    """``rec`` (a provisional pick: no finalist round, so no numerics check ran) with the note that its numerics were
    not checked, where its config changes the arithmetic (``parity.needs_parity``)."""
    from autotune.trial.parity import needs_parity, world_of

    if not needs_parity(rec.config, world_size=world_of(rec.workload)):
        return rec
    return dataclasses.replace(rec, notes=(*rec.notes, "numerics not checked against fp32 eager: the budget left no "
                                                       "time for the check (a longer --timeout checks it)"))
