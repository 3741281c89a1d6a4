"""Compile last: ``torch.compile`` is one more knob, tried on the best eager config once the eager search settled.

A compile trial costs far more than an eager one (80-95 s cold on this project's CPUs), and what compile
gains depends on the eager config under it. A sampler that picks compile modes at an arbitrary batch and
thread count spends that on configs that are not the best (issue 25: 3 of 12 trials went that way). So the
sampler never proposes a compile mode (``compile_gate.holding_back``), and once the eager search settled
(``settle``: it converged, the sampler ran out of new configs, or the budget has room for the compile trial
and no more) the best feasible eager config is measured with the space's compile modes, ``default`` first; a
further mode (``max-autotune``: longer to compile) only when the one before beat eager by more than the noise
(``advance``). The compile gate decides whether a compile trial fits the time left at all
(``CompileGate.reason``); the finalists then price compile over the planned run (``payback``).

The state is the study's: ``eager_settled`` (why, and what became of compile) on the study, ``compile_last``
(the mode) on each compile trial, so a resumed run goes on where the last one stopped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys
from autotune.search.record.trials import MemoryLimit, config_of, feasible_by_config

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["modes", "best_eager", "settle", "advance", "pending", "summary"]


def modes(space) -> list[str]:
    """The compile modes the (trimmed) space offers, ``default`` first; none when compile is not searched."""
    p = next((p for p in space.params if p.name == "compile_mode"), None)
    found = [m for m in (p.choices if p is not None else ()) if m != "none"]
    return sorted(found, key=lambda m: (m != "default", found.index(m)))


def best_eager(study: Study, *, fingerprint: str, limit: MemoryLimit):
    """The best feasible measured trial without compile, or None."""
    eager = [t for t in feasible_by_config(study, fingerprint, limit).values()
             if config_of(t).compile_mode == "none" and t.params]
    return max(eager, key=lambda t: t.value or 0.0, default=None)


def _tried(study: Study) -> list:
    return sorted((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(keys.COMPILE_LAST)),
                  key=lambda t: t.number)


def pending(study: Study) -> bool:
    """A compile trial is queued or running."""
    return any(not t.state.is_finished() for t in _tried(study))


def settle(study: Study, space, *, why: str, blocked: str | None, fingerprint: str, limit: MemoryLimit,
           enqueue: Callable[..., None], log: Callable[[str], None]) -> None:
    """Record once that the eager search settled (``why``) and queue the first compile mode on the best eager
    config, unless ``blocked`` (the compile gate's reason), the space has no compile mode, or nothing ran."""
    if study.user_attrs.get(keys.EAGER_SETTLED) is not None:
        return
    state: dict[str, Any] = {"why": why}
    found = modes(space)
    best = best_eager(study, fingerprint=fingerprint, limit=limit)
    if found and best is not None and blocked is None:
        _queue(study, space, best, found[0], enqueue=enqueue, log=log)
        state["base"] = best.number
    elif found:
        state["compile"] = ("not tried: " + blocked.removeprefix("compile held back: ")) if blocked else \
            "not tried: no eager config ran"
        log(f"eager search settled ({why}); compile {state['compile']}")
    study.set_user_attr(keys.EAGER_SETTLED, state)


def _queue(study: Study, space, base_trial, mode: str, *, enqueue, log) -> None:
    params = {**base_trial.params, "compile_mode": mode}
    key = space.effective(params).key()
    if any((c := config_of(t, space)) is not None and c.key() == key for t in study.get_trials(deepcopy=False)):
        return  # measured already (a study from before compile came last)
    enqueue(study, space, params, **{keys.COMPILE_LAST: mode})
    log(f"the eager search settled: compile {mode} is tried last, on trial {base_trial.number}'s config "
        f"({config_of(base_trial).short()}, {base_trial.value:.1f} samples/s)")


def advance(study: Study, space, *, noise: float, fingerprint: str, limit: MemoryLimit, enqueue: Callable[..., None],
            log: Callable[[str], None]) -> None:
    """After a compile trial: the next mode on the same eager config when this one beat it by more than
    ``noise`` (a further mode costs a longer compile, worth it only where compile pays at all)."""
    state = study.user_attrs.get(keys.EAGER_SETTLED)
    tried = _tried(study)
    if not state or state.get("base") is None or not tried or pending(study):
        return
    found = modes(space)
    last = tried[-1]
    base = next((t for t in study.get_trials(deepcopy=False) if t.number == state["base"]), None)
    nxt = found.index(last.user_attrs[keys.COMPILE_LAST]) + 1 if last.user_attrs[keys.COMPILE_LAST] in found else 0
    if base is None or nxt >= len(found) or nxt == 0 or len(tried) > nxt:
        return
    if last.user_attrs.get(keys.STATUS) == "ok" and (last.value or 0.0) > (base.value or 0.0) * (1 + noise):
        _queue(study, space, base, found[nxt], enqueue=enqueue, log=log)


def summary(study: Study) -> str:
    """Why the search stopped: why the eager search settled, and what compile did on its best config."""
    state = study.user_attrs.get(keys.EAGER_SETTLED) or {}
    why = state.get("why", "")
    if state.get("compile"):
        return f"{why}; compile {state['compile']}"
    tried = [t for t in _tried(study) if t.state.is_finished()]
    base = next((t for t in study.get_trials(deepcopy=False) if t.number == state.get("base")), None)
    if not tried or base is None:
        return why
    parts = []
    for t in tried:
        mode = t.user_attrs[keys.COMPILE_LAST]
        if t.user_attrs.get(keys.STATUS) == "ok" and base.value:
            parts.append(f"{mode} {t.value:.1f} samples/s, x{t.value / base.value:.2f} of eager (trial {t.number})")
        else:
            parts.append(f"{mode} {t.user_attrs.get(keys.STATUS, t.state.name.lower())} (trial {t.number})")
    return f"{why}; compile tried last on trial {base.number}'s config: " + "; ".join(parts)
