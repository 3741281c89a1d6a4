"""When the two ceilings are measured, and how (``autotune.search.record.ceilings`` holds them and the model of the
pipeline that reads them): once per study, after the baseline and the likely winners, when the baseline waited for
data more than ``INPUT_BOUND_SHARE`` of its step or the trials run on a GPU, and the space searches ``num_workers``;
each point a trial child of its own (``MeasureSpec.part``), under the trials' caps.

**Inside the search's share of a budget.** With ``--timeout`` the climb is priced from the run's ``Budget``: it
may take what the search has left before the phases after it (``Budget.search_left_s``: the finalists', the
confirmation's and the numerics check's reserves), less one trial that runs the count it finds (``climb_allowance_s``).
It runs when that allowance holds ``MIN_CHILDREN`` children (the model and two data points) and stops measuring when
the next point would not end within it; the points it measured are kept, and the loader is sized from them. Its time
is its own, not a trial's: the backend's trial walls (which price the long trial the search must still fit) do not
include it.

**The training process the fed configs will have.** Each data point is the likely winners' config as it ran (the
baseline's where the space has none) with that many workers, through ``SearchSpace.effective``: its intra-op
threads are those the workers leave (never more threads than cores, as a point at every core with the baseline's
threads would be), and its allocator and thread settings are those of trial 1, whose fork server forks it. The feed
(``ceilings.feed``) gives the fed configs those threads."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.budget import long_trial_s
from autotune.search.plan.climb import climb
from autotune.search.record.ceilings import FED, INPUT_BOUND_SHARE, Ceilings, Point, load, offered_workers, store
from autotune.search.space.likely import hint_workers

if TYPE_CHECKING:
    from optuna import Study

    from autotune.search.budget import Budget

__all__ = ["INPUT_BOUND_SHARE", "MIN_CHILDREN", "FED_SHARE", "SKIPPED", "wanted", "measure_if_wanted", "loader_config",
           "climb_allowance_s"]

# The fewest children a climb worth running measures: the model and two data points (one worker, and the count its
# rate predicts). A budget whose search share holds fewer skips the climb, saying so, and feeds a guess.
MIN_CHILDREN = 3
SKIPPED = "ceilings skipped"  # said once a run skipped them (the tuner's ``said``): not asked again in that run
# On a GPU, likely winners that waited for data under this share of their step were fed by their loader (the
# per-trial diagnosis calls a step input-bound from 30%): no climb (``_fed_already``).
FED_SHARE = 0.10


def wanted(baseline_wait_share: float | None, *, device: str, space: Any) -> str | None:
    """Why the ceilings should be measured now (a line for the log), or None: the space searches workers, and the
    baseline waited for data more than ``INPUT_BOUND_SHARE`` of its step, or the trials run on a GPU."""
    p = next((p for p in space.params if p.name == "num_workers"), None)
    if p is None or not offered_workers(p.choices):
        return None
    if isinstance(baseline_wait_share, (int, float)) and baseline_wait_share > INPUT_BOUND_SHARE:
        return (f"the baseline waited for data {100 * baseline_wait_share:.0f}% of its step (over "
                f"{100 * INPUT_BOUND_SHARE:.0f}%: input-bound)")
    if device.startswith("cuda"):
        return "the trials run on a GPU, where one core's data path rarely keeps up with the model"
    return None


def _first(study: Study, role: str):
    """The first trial in ``role`` that measured its config: one a killed run interrupted measured nothing (its
    retry, queued with the same role, will)."""
    from autotune.search.record import trials as keys

    done = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(role) and t.state.is_finished()
            and t.user_attrs.get(keys.STATUS) not in keys.NOT_MEASURED]
    return min(done, key=lambda t: t.number) if done else None


def climb_allowance_s(budget: Budget | None, walls: list[float], *, check_s: float = 0.0) -> float | None:
    """Seconds the climb may take within ``budget``: what the search has left before the phases after it
    (``Budget.search_left_s`` with the trials' ``walls`` so far and the numerics check's ``check_s``), less one
    trial that runs the count it finds (a long trial of those so far); None without a deadline.

    >>> from autotune.search.budget import Budget
    >>> b = Budget.of(1000.0, started=time.monotonic())  # 3 finalists and the baseline, 2 rounds of 30 s: 240 s
    >>> round(climb_allowance_s(b, [20.0, 30.0]))           # 1000 s less that reserve and one more 30 s trial
    730
    """
    if budget is None or budget.deadline is None:
        return None
    return budget.search_left_s(walls, check_s=check_s) - long_trial_s(walls)


def measure_if_wanted(study: Study, space: Any, *, runner: Callable[..., Any], workload: Any, measure: Any,
                      log_dir: Any, log: Callable[[str], None], budget: Budget | None = None,
                      check_s: Callable[[], float] | None = None, said: set[str] | None = None) -> Ceilings | None:
    """After the baseline and the likely winners ran: measure and store the ceilings when ``wanted`` says so and
    the study has none (once per study; a resumed run reads them back). Returns them, or None. Within ``budget``
    (its deadline), only inside the search's share (``climb_allowance_s``; ``check_s()``: the seconds of the
    numerics check the search keeps back): a budget is a budget (module docstring)."""
    from autotune.search.record import trials as keys

    before = load(study)
    if before is not None and (before.model is not None or before.data):  # a budget's skip: a later run may measure
        return None
    if said is not None and SKIPPED in said:  # skipped in this run already (``said``: the run's, kept by the tuner)
        return None
    base = _first(study, keys.BASELINE)
    likely = _first(study, keys.LIKELY_WINNER) if space.likely_params() is not None else None
    if base is None or (space.likely_params() is not None and likely is None):
        return None
    why = wanted(base.user_attrs.get(keys.DATA_WAIT_SHARE), device=workload.device, space=space)
    if why is None:
        return None
    ran = [t for t in (base, likely) if t is not None and t.user_attrs.get(keys.STATUS) == "ok"]
    if not ran:
        return None
    if _fed_already(study, likely, workload, log, said):
        return None
    model_config = {**keys.config_of(max(ran, key=lambda t: t.value or 0.0)).to_dict(),  # its loader plays no part
                    "num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    # the likely winners' config as it ran, even where it failed (its fork server is the one alive)
    data_config = loader_config(keys.config_of(likely or base).to_dict(), space)
    offered, cut = _within_loader_memory(space, data_config, _climbed(space, workload))
    walls = [w for t in (base, likely) if t is not None and (w := t.user_attrs.get(keys.WALL_S))]
    allowance = climb_allowance_s(budget, walls, check_s=check_s() if check_s and budget is not None else 0.0)
    if allowance is not None and allowance < MIN_CHILDREN * min(walls, default=0.0):
        _skip(study, space, workload, log, said, offered=offered, allowance=allowance, child_s=min(walls, default=0.0))
        return None
    world = workload.nproc_per_node
    ranks = f" per rank, in {world} DDP ranks at once as the trials run" if world > 1 else ""
    within = f", within {allowance:.0f} s of the search's share of the budget" if allowance is not None else ""
    log(f"measuring the two ceilings, each alone in a child ({why}): the model on one batch on the device, then "
        + (f"the data path from 1 worker to as many as cover the model (up to {offered[-1]}{ranks}{within})"
           if offered else "no data path: no worker count fits the loader's memory"))
    spec = measure.replace(windows=min(measure.windows, 3), settle_windows=min(measure.settle_windows, 1))
    point = _PointRunner(runner, workload, spec, log_dir, space)
    c = climb(model_config, data_config, offered, point, log=log, why=why, world=world,
              fits=_fits(allowance, point, first_s=min(walls, default=0.0)))
    c = dataclasses.replace(c, world_size=world, device=workload.device_family, notes=c.notes + ((cut,) if cut else ()))
    store(study, c)
    for line in c.notes:
        log(f"ceiling: {line}")
    feed_w = c.workers_to_feed()
    if feed_w is not None:
        log(f"ceiling: the fewest workers to feed the model: {feed_w}{c.per_rank}"
            + ("" if c.feeds() else " (none measured covers it: the data path binds whatever the knobs)"))
    return c


def _climbed(space: Any, workload: Any) -> list[int]:
    """The worker counts the climb may measure: those the space offers; on a GPU up to a rank's cores less one
    (Lightning's hint, as the likely winners' loader): the training process keeps a core busy launching the
    model's kernels and pinning batches, and a point's noise (5% on the H200) cannot tell the count that takes its
    core from the one that leaves it (a few %). The sampler may still try every core."""
    offered = offered_workers(next(p.choices for p in space.params if p.name == "num_workers"))
    hint = hint_workers(offered, space.rank_cores) if workload.device_family != "cpu" else None
    return [c for c in offered if c <= hint] if hint else offered


def _fed_already(study: Study, likely: Any, workload: Any, log: Callable[[str], None], said: set[str] | None) -> bool:
    """On a GPU, the likely winners' loader (Lightning's hint) already fed the model: they waited for data under
    ``FED_SHARE`` of their step. Then the climb could only find fewer workers for the same rate, and its time goes
    to the model's knobs (the batch, compile) instead: the feed is that loader, said and stored (True)."""
    from autotune.search.record import trials as keys

    if likely is None or workload.device_family == "cpu" or likely.user_attrs.get(keys.STATUS) != "ok":
        return False
    wait = likely.user_attrs.get(keys.DATA_WAIT_SHARE)
    workers = keys.config_of(likely).num_workers
    if not isinstance(wait, (int, float)) or wait >= FED_SHARE or not workers:
        return False
    log(f"ceilings not measured: the likely winners' loader ({workers} worker(s), a rank's cores less one) already "
        f"feeds the model (they waited for data {100 * wait:.0f}% of their step): the search's time goes to the "
        "model's knobs")
    store(study, Ceilings(model=None, why=f"not measured: the likely winners' {workers} worker(s) {FED} "
                                          f"(waiting {100 * wait:.0f}% of the step)",
                          device=workload.device_family, guess=workers))
    if said is not None:
        said.add(SKIPPED)
    return True


def _skip(study: Study, space: Any, workload: Any, log: Callable[[str], None], said: set[str] | None, *,
          offered: list[int], allowance: float, child_s: float) -> None:
    """A budget too short for the climb: the baseline is input-bound or on a GPU all the same, so its loader gets a
    guess (a rank's cores less one, Lightning's hint, within the counts the loader's memory allows: ``offered``),
    measured as the trials are; said once, stored."""
    guess = hint_workers(offered, space.rank_cores)
    cost = MIN_CHILDREN * child_s
    log(f"ceilings not measured: the climb (at least {MIN_CHILDREN} children, ~{cost:.0f} s) does not fit the "
        f"{max(0.0, allowance):.0f} s the search's share of the budget leaves it after one more trial"
        + (f"; the loader gets {guess} worker(s) instead, unmeasured (a rank's cores less one, Lightning's hint)"
           if guess else ""))
    store(study, Ceilings(model=None, why=f"not measured: ~{cost:.0f} s, over the search's share of the budget",
                          device=workload.device_family, guess=guess))
    if said is not None:
        said.add(SKIPPED)


def _fits(allowance: float | None, point: Any, *, first_s: float) -> Callable[[], bool]:
    """Whether one more data point fits the climb's ``allowance`` (None: always), counted from now: the longest
    child so far (``point.longest_s``; before any, ``first_s``) must still end within it."""
    if allowance is None:
        return lambda: True
    end = time.monotonic() + allowance
    return lambda: time.monotonic() + (point.longest_s or first_s) <= end


def _within_loader_memory(space: Any, data_config: dict[str, Any], offered: list[int]) -> tuple[list[int], str]:
    """The worker counts the climb may measure: those whose loader, at the data config's batch, fits the machine's
    shared memory (``search.space.loader_fit``; the prefetch lowered as the trials' would be), and the ceilings' note
    when that stops the climb below the most offered ("" when it does not)."""
    fit = getattr(space, "loader", None)
    if fit is None or not offered:
        return offered, ""
    most = fit.most_workers(data_config, offered)
    if most >= offered[-1]:
        return offered, ""
    return [w for w in offered if w <= most], (
        f"the data path's climb stops at {most} worker(s): more, at batch {data_config.get('batch_size')}, would not "
        "fit the machine's loader memory while the training loop pauses (the space's note: loader memory)")


def loader_config(config: dict[str, Any], space: Any) -> dict[str, Any]:
    """The baseline's config with the loader knobs a fed config would take: pinned memory (on a GPU) and
    persistent workers where the space offers them, its prefetch (else the first offered)."""
    choices = {p.name: p.choices for p in space.params}
    out = dict(config)
    for knob, want in (("pin_memory", True), ("persistent_workers", True)):
        if want in choices.get(knob, ()):
            out[knob] = want
    if "prefetch_factor" in choices and out.get("prefetch_factor") not in choices["prefetch_factor"]:
        out["prefetch_factor"] = choices["prefetch_factor"][0]
    return out


class _PointRunner:
    """Runs one ceiling's point in a child (``Run``): a data point's config through ``space.effective`` (threads
    within the cores its workers leave); keeps the longest child's wall (``longest_s``) for ``_fits``."""

    def __init__(self, runner: Callable[..., Any], workload: Any, spec: Any, log_dir: Any, space: Any) -> None:
        self.runner, self.workload, self.spec, self.log_dir, self.space = runner, workload, spec, log_dir, space
        self.longest_s = 0.0

    def __call__(self, config: dict[str, Any], part: str) -> Point:
        from pathlib import Path

        from autotune.config import TrialConfig

        fit = getattr(self.space, "loader", None)  # a data point's prefetch lowered to fit, as the trials' (loader_fit)
        if part == "data":
            cfg = self.space.effective(fit.clamp(config) if fit is not None else config)
        else:
            cfg = TrialConfig.from_dict(config)
        name = f"ceiling-{part}" + (f"-w{cfg.num_workers}" if part == "data" else "") + ".log"
        kw = {"log_path": Path(self.log_dir) / name} if self.log_dir is not None else {}
        t0 = time.monotonic()
        r = self.runner(self.workload, cfg, self.spec.replace(part=part), **kw)
        self.longest_s = max(self.longest_s, time.monotonic() - t0)
        if r.user_error:  # the workload's own fault (a collate that raises, a worker that crashes): said, not retried
            from autotune.errors import WorkloadError

            raise WorkloadError(r.reason.removeprefix("WorkloadError: "))
        ok = r.status == "ok" and bool(r.samples_per_s)
        return Point(part=part, config=cfg.to_dict(), samples_per_s=r.median_samples_per_s if ok else 0.0,
                     windows=tuple(r.samples_per_s), rel_iqr=r.summary.rel_iqr if ok else None,
                     cpu_cores_used=r.cpu_cores_used, status=r.status, reason=r.reason)

