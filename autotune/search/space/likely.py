"""The likely winners: knob values that usually win, tried together right after the baseline (trial 1), then
taken apart by the planned search (``coordinate``). A guess measured like any trial, never a rule: where one of them
hurts, the separation finds it.

Which values, per CPU kind, is data: ``search_spaces/likely.yaml`` (``winners_for``), each kind's entry measured by
the project's benchmark runs on that kind of machine (``benchmarks/likely_winners.py``), with the machine and the
date; a kind without one takes the file's ``default``. Issue 50: on one CPU the allocator that won (tcmalloc) was
not in the bundle, and a 10-minute budget ended before the search reached it.

``SearchSpace.likely_params`` and ``SearchSpace.LIKELY_WINNERS`` are these.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["LIKELY_WINNERS", "TRADE_DOWN", "likely_params", "hint_workers", "winners_for", "measured_on",
           "compile_rarely_pays", "sweep_order", "COMPILE_PAYS", "COMPILE_RUNS"]

# compile "pays" on a kind where a run measured it more than this ahead of its eager config (the plan's noise floor);
# a kind's record says it rarely pays once it holds at least COMPILE_RUNS runs and none of them did
COMPILE_PAYS = 0.05
COMPILE_RUNS = 3


@functools.lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    """``search_spaces/likely.yaml``, read once."""
    import yaml

    try:
        text = resources.files("autotune.search_spaces").joinpath("likely.yaml").read_text()
    except ModuleNotFoundError:  # a source checkout never installed (as ``search_space.default_space_path``)
        text = (Path(__file__).resolve().parents[3] / "search_spaces" / "likely.yaml").read_text()
    return yaml.safe_load(text)


def _knobs(entry: dict[str, Any]) -> dict[str, tuple]:
    return {k: tuple(v) for k, v in (entry.get("knobs") or {}).items()}


def winners_for(kind: str | None) -> dict[str, tuple]:
    """Each knob's likely winners in order of preference for a CPU of ``kind`` (``Hardware.cpu_kind``; None: a
    GPU's or an unknown machine's): the kind's measured entry, the default's knobs it does not name kept.

    >>> winners_for("avx512_bf16")["malloc"][0], winners_for(None)["malloc"][0]
    ('tcmalloc', 'retain')
    """
    data = _data()
    default = _knobs(data["default"])
    entry = (data.get("kinds") or {}).get(kind) if kind else None
    return {**default, **_knobs(entry)} if entry else default


def measured_on(kind: str | None) -> str:
    """Where the likely winners of ``kind`` were measured, in a few words ("" for the default's).

    >>> measured_on("avx2")
    'measured on AMD EPYC (2 usable cores, AVX2, no bf16), 24 GiB, 2026-11-26'
    """
    entry = (_data().get("kinds") or {}).get(kind) if kind else None
    runs = (entry or {}).get("measured") or []
    return f"measured on {runs[-1]['machine']}, {runs[-1]['date']}" if runs else ""


def compile_rarely_pays(kind: str | None) -> str | None:
    """Why a budget gives torch.compile no room of its own on a CPU of ``kind``, or None: its record in
    ``likely.yaml`` (``compile.<kind>``) holds ``COMPILE_RUNS`` runs or more and none ran more than ``COMPILE_PAYS``
    ahead of eager. The search then tries compile only where the eager search converges or runs out of configs
    first (``search.plan.phases``).

    >>> compile_rarely_pays("amx").split(" (measured on")[0]
    'on this CPU kind (amx) compile ran x0.70-x1.05 of eager in 6 runs, never over 5% ahead'
    >>> compile_rarely_pays(None), compile_rarely_pays("avx2")
    (None, None)
    """
    record = ((_data().get("compile") or {}).get(kind) or {}) if kind else {}
    ratios = [float(r) for r in record.get("of_eager") or ()]
    if len(ratios) < COMPILE_RUNS or max(ratios) > 1 + COMPILE_PAYS:
        return None
    runs = record.get("measured") or []
    where = f" (measured on {runs[-1]['machine']}, {runs[-1]['date']})" if runs else ""
    return (f"on this CPU kind ({kind}) compile ran x{min(ratios):.2f}-x{max(ratios):.2f} of eager in {len(ratios)} "
            f"runs, never over {COMPILE_PAYS:.0%} ahead{where}")


def sweep_order(space: Any) -> list[Any]:
    """``space``'s parameters in the order the planned search's coordinate step tries them (``coordinate``): the
    knobs ``likely.yaml`` names for its CPU kind under ``sweep_first`` first, in that order, then the rest in the
    space's order. Data, as the likely winners are: on the AMX Xeon bf16 lost at batch 16-32 and left the bundle,
    yet at batch 64-256 it was tiny_vit's largest gain (x1.36 against x1.15 without it), and a 4-minute search that
    tried the loader and the threads first ran out before it (2026-11-30).

    >>> from types import SimpleNamespace as P
    >>> params = [P(name="num_workers"), P(name="amp")]
    >>> [[p.name for p in sweep_order(P(device="cpu", cpu_kind=kind, params=params))] for kind in ("amx", "avx2")]
    [['amp', 'num_workers'], ['num_workers', 'amp']]
    """
    kind = getattr(space, "cpu_kind", None) if space.device == "cpu" else None
    first = list((((_data().get("sweep_first") or {}).get(kind) or {}) if kind else {}).get("knobs") or ())
    return sorted(space.params, key=lambda p: first.index(p.name) if p.name in first else len(first))


# The default's (a GPU's, or a CPU kind with no runs of its own): ``winners_for(None)``
LIKELY_WINNERS = winners_for(None)
# Where the loader's memory caps the likely winners' workers, their batch may shrink to this fraction of the
# baseline's at most (``_batch_for_workers``): below it the model's step loses more to launch overhead than a few
# more workers give back.
TRADE_DOWN = 4


def likely_params(space: Any) -> dict[str, Any] | None:
    """``space``'s baseline with the usual winners it offers switched on (Optuna params), or None when that is the
    baseline itself. In order of preference per knob (``winners_for`` the space's CPU kind): the first one the
    trimmed space offers is taken. On a GPU the loader too (``_gpu_loader``)."""
    base = space.baseline_params()
    params = dict(base)
    choices = {p.name: p.choices for p in space.params}
    kind = getattr(space, "cpu_kind", None) if space.device == "cpu" else None
    for name, preferred in winners_for(kind).items():
        value = next((v for v in preferred if v in choices.get(name, ())), None)
        if value is not None:
            params[name] = value
    if space.device != "cpu":  # on a GPU the loader is every recipe's first fix
        params.update(_gpu_loader(choices, space.rank_cores))
        params.update(_batch_for_workers(space, params))
    return params if params != base else None


def hint_workers(offered, rank_cores: int) -> int | None:
    """Lightning's worker hint, ``max(1, cpus // ranks - 1)``, as the most of ``offered`` within it (None when none
    above 0 is): the likely winners' loader on a GPU, and the ceilings' guess when a budget skips the climb.

    >>> hint_workers((0, 1, 2, 4, 8), 6), hint_workers((0, 2), 1), hint_workers((0,), 16)
    (4, None, None)
    """
    return max((c for c in offered if 0 < c <= max(1, rank_cores - 1)), default=None)


def _gpu_loader(choices: dict[str, tuple], rank_cores: int) -> dict[str, Any]:
    """The likely winners' loader on a GPU: the most workers up to a rank's cores less one (Lightning's hint,
    ``max(1, cpus // ranks - 1)``), pinned memory, persistent workers and PyTorch's prefetch (2), as the space offers
    them. A guess measured
    like any trial; the ceilings (``search.record.ceilings``) then size the loader from measurements."""
    out: dict[str, Any] = {}
    workers = hint_workers(choices.get("num_workers", ()), rank_cores)
    if workers:
        out["num_workers"] = workers
        if True in choices.get("persistent_workers", ()):
            out["persistent_workers"] = True
        # set, not left to the sampler (an enqueued trial's missing knob is sampled): PyTorch's default where the
        # space offers it, else its smallest (each in-flight batch is shared memory: workers x prefetch x batch)
        prefetch = choices.get("prefetch_factor", ())
        if prefetch:
            out["prefetch_factor"] = 2 if 2 in prefetch else min(prefetch)
    if True in choices.get("pin_memory", ()):
        out["pin_memory"] = True
    return out


def _batch_for_workers(space: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The likely winners' batch where the machine's loader memory (``space.loader``: ``search.space.loader_fit``)
    holds their loader to fewer workers than they ask (Lightning's hint) at the baseline's batch: what a loader holds
    in flight is ``workers x prefetch + 1`` batches, so a smaller batch lets more workers run, and on a GPU the few
    workers that fit are what binds (the hint's many would feed it). The largest offered batch, down to the
    baseline's over ``TRADE_DOWN``, at which the asked workers fit; where none does, the one at which the most fit
    (the larger among equals). ``{}`` (no change) where they fit at the baseline's batch, or nothing is known. A
    guess like the rest of the bundle: its separation measures the batch reverted."""
    fit = getattr(space, "loader", None)
    asked = int(params.get("num_workers") or 0)
    batch = params.get("batch_size")
    choices = next((p.choices for p in space.params if p.name == "batch_size"), ())
    if fit is None or asked <= 0 or batch not in choices:
        return {}

    def fitting(b: int) -> int:
        return space.effective({**params, "batch_size": b}).num_workers

    if fitting(batch) >= asked:
        return {}
    smaller = sorted((b for b in choices if batch / TRADE_DOWN <= b < batch), reverse=True)
    enough = next((b for b in smaller if fitting(b) >= asked), None)
    best = enough or max([batch, *smaller], key=lambda b: (fitting(b), b))
    return {"batch_size": best} if best != batch else {}
