"""What the search never measured: the values of the space's knobs that no finished trial ran, where they apply to
the recommended config. A budget that ends before the plan's coordinate step reached a knob (the allocator, the
inter-op threads) leaves them unmeasured; the recommendation says so in its YAML (``try``) and notes, as it says an
unmeasured worker count (``ceilings``), so a user with a night to spare knows what a longer run would add.

A value counts as tried when any finished trial (ok, pruned, failed, or over the memory limit) ran it: it was
measured somewhere in the study, if not beside the recommendation's other knobs. The batch size (walked) and
knobs fixed by the space are left out; so is a knob whose condition the recommendation does not meet (prefetch
with no workers).

>>> from types import SimpleNamespace
>>> from autotune.search.space.param import Param as P
>>> space = SimpleNamespace(params=[P("malloc", "categorical", ("default", "retain", "tcmalloc")),
...                                 P("prefetch_factor", "int", (2, 4), when=("num_workers", ">", 0)),
...                                 P("batch_size", "int", (16, 32))])
>>> untried(space, [{"malloc": "default"}, {"malloc": "retain", "num_workers": 0}], {"malloc": "retain",
...         "num_workers": 0, "batch_size": 32})
{'malloc': ['tcmalloc']}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, NamedTuple

from autotune.search.record.trials import CONFIG, config_of

__all__ = ["untried", "untried_in_study", "untried_line", "OneDraw", "one_draw_line", "NOT_LISTED"]

# walked by its own plan (batch_walk) and so never "untried" in the coordinate step's sense
NOT_LISTED = ("batch_size",)


def untried(space: Any, ran: Iterable[dict[str, Any]], recommended: dict[str, Any]) -> dict[str, list]:
    """``{knob: [values no finished trial ran]}`` over ``space.params`` (``Param``s: a name, choices and a condition,
    ``Param.holds``), given the configs the study ``ran`` (dicts of knob values) and the ``recommended`` config's; empty
    when every value was measured."""
    seen: dict[str, set] = {}
    for config in ran:
        for k, v in config.items():
            seen.setdefault(k, set()).add(_hashable(v))
    out: dict[str, list] = {}
    for p in space.params:
        if p.name in NOT_LISTED or len(p.choices) < 2:
            continue
        if not p.holds(recommended):
            continue
        missing = [c for c in p.choices if _hashable(c) not in seen.get(p.name, set())]
        if missing:
            out[p.name] = missing
    return out


def untried_in_study(space: Any, trials: Iterable[Any], recommended: Any) -> dict[str, list]:
    """``untried`` over a study's ``trials`` (Optuna's) and the ``recommended`` ``TrialConfig``: each finished
    trial read as the full config it ran (``trials.config_of``), for a stored config leaves DDP's arguments out at
    their defaults (``TrialConfig.to_dict``), and read as stored it named bucket_cap_mb=25 untried on a run whose
    every trial ran it."""
    ran = [dataclasses.asdict(config_of(t)) for t in trials if t.state.is_finished() and t.user_attrs.get(CONFIG)]
    return untried(space, ran, dataclasses.asdict(recommended))


def untried_line(knobs: dict[str, list], *, budget_ended: bool) -> str:
    """The note that says what was never measured; "" for none.

    >>> line = untried_line({"malloc": ["tcmalloc", "hugepages"], "inter_op_threads": [1]}, budget_ended=True)
    >>> line.split("; ")[0]
    'never measured before the budget ended: malloc=tcmalloc/hugepages, inter_op_threads=1'
    """
    if not knobs:
        return ""
    what = ", ".join(f"{k}={'/'.join(str(v) for v in vs)}" for k, vs in knobs.items())
    when = "before the budget ended" if budget_ended else "by the search"
    return (f"never measured {when}: {what}; "
            + ("a longer --timeout measures them" if budget_ended
               else "`autotune trial` measures one by hand if it matters to you"))


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class OneDraw(NamedTuple):
    """A candidate the planned search put out on one trial within the noise below the config it was compared with
    (``coordinate.Plan.one_draw``): the knobs it changed and their values, its gap (a fraction, <= 0), its config's
    key and that of the config it was compared with (``TrialConfig.key``)."""

    knobs: dict[str, Any]
    gap: float
    key: tuple = ()
    against: tuple = ()


def one_draw_line(decided: list[OneDraw], config: Any, measured: Iterable[tuple] = ()) -> str:
    """The note that says which candidates one trial put out within the noise, but those the recommended ``config``
    holds anyway and those the finalists' rounds measured again (``measured``: config keys); "" for none.

    >>> from autotune.config import TrialConfig
    >>> line = one_draw_line([OneDraw({"amp": "bf16"}, -0.021), OneDraw({"malloc": "retain"}, -0.01)],
    ...                      TrialConfig(batch_size=8, malloc="retain"))
    >>> line.split("; ")[0]
    'decided on one trial, within the noise below the config before it: amp=bf16 (-2.1%)'
    """
    measured = set(measured)
    out = dict.fromkeys(  # the same knobs and gap twice (two comparisons): named once
        f"{', '.join(f'{k}={v}' for k, v in d.knobs.items())} ({100 * d.gap:+.1f}%)" for d in decided
        if d.knobs and d.key not in measured and any(getattr(config, k, None) != v for k, v in d.knobs.items()))
    if not out:
        return ""
    return (f"decided on one trial, within the noise below the config before it: {', '.join(out)}; `autotune trial` "
            "measures it again by hand if it matters to you")
