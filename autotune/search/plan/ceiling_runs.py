"""When the two ceilings are measured, and how (``autotune.search.record.ceilings`` holds them and the model of the
pipeline that reads them): once per study, after the baseline and the likely winners, when the baseline waited for
data more than ``INPUT_BOUND_SHARE`` of its step or the trials run on a GPU, and the space searches ``num_workers``;
within ``BUDGET_SHARE`` of a --timeout budget's time left; each point a trial child of its own
(``MeasureSpec.part``), under the trials' caps."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record.ceilings import Ceilings, Point, Run, climb, load, offered_workers, store
from autotune.search.space.likely import hint_workers

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["INPUT_BOUND_SHARE", "BUDGET_SHARE", "SKIPPED", "wanted", "measure_if_wanted", "loader_config"]

# From this share of a step spent waiting for data the planned search sizes the loader first (the TF profiler calls
# a step "highly input-bound" from 20%); the per-trial diagnosis says "input-bound" from 30% (``diagnose``).
INPUT_BOUND_SHARE = 0.20
# The most of the time left in a --timeout budget the climb may take (skipped, saying so, when it would take more).
BUDGET_SHARE = 0.25
SKIPPED = "ceilings skipped"  # said once a run skipped them (the tuner's ``said``): not asked again in that run


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


def measure_if_wanted(study: Study, space: Any, *, runner: Callable[..., Any], workload: Any, measure: Any,
                      log_dir: Any, log: Callable[[str], None], time_left_s: float | None = None,
                      said: set[str] | None = None) -> Ceilings | None:
    """After the baseline and the likely winners ran: measure and store the ceilings when ``wanted`` says so and
    the study has none (once per study; a resumed run reads them back). Returns them, or None. With
    ``time_left_s`` (a budget), only when the climb's expected cost (a child a point, each about the median trial's
    wall) is at most ``BUDGET_SHARE`` of it: a budget is a budget."""
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
    model_config = {**keys.config_of(max(ran, key=lambda t: t.value or 0.0)).to_dict(),  # its loader plays no part
                    "num_workers": 0, "prefetch_factor": None, "persistent_workers": False}
    data_config = loader_config(keys.config_of(base).to_dict(), space)
    offered, cut = _within_loader_memory(space, data_config,
                                         offered_workers(next(p.choices for p in space.params
                                                              if p.name == "num_workers")))
    if time_left_s is not None:  # a child a point, the model and about three data points, each about a trial
        walls = [w for t in (base, likely) if t is not None and (w := t.user_attrs.get(keys.WALL_S))]
        cost = 4 * min(walls, default=0.0)
        if cost > BUDGET_SHARE * time_left_s:
            # the baseline is input-bound or on a GPU all the same: its loader gets a guess, measured as the trials
            guess = hint_workers(offered, space.rank_cores)
            log(f"ceilings not measured: the climb (~{cost:.0f} s) would take more than {BUDGET_SHARE:.0%} of the "
                f"{time_left_s:.0f} s left in the budget"
                + (f"; the loader gets {guess} worker(s) instead, unmeasured (a rank's cores less one, Lightning's "
                   "hint)" if guess else ""))
            store(study, Ceilings(model=None, why=f"not measured: ~{cost:.0f} s, over the budget's share",
                                  device=workload.device_family, guess=guess))
            if said is not None:
                said.add(SKIPPED)
            return None
    world = workload.nproc_per_node
    ranks = f" per rank, in {world} DDP ranks at once as the trials run" if world > 1 else ""
    log(f"measuring the two ceilings, each alone in a child ({why}): the model on one batch on the device, then "
        + (f"the data path from 1 worker to as many as cover the model (up to {offered[-1]}{ranks})" if offered
           else "no data path: no worker count fits the loader's memory"))
    spec = measure.replace(windows=min(measure.windows, 3), settle_windows=min(measure.settle_windows, 1))
    run = _point_runner(runner, workload, spec, log_dir, space)
    c = climb(model_config, data_config, offered, run, log=log, why=why)
    c = dataclasses.replace(c, world_size=world, device=workload.device_family, notes=c.notes + ((cut,) if cut else ()))
    store(study, c)
    for line in c.notes:
        log(f"ceiling: {line}")
    feed_w = c.workers_to_feed()
    if feed_w is not None:
        log(f"ceiling: the fewest workers to feed the model: {feed_w}{c.per_rank}"
            + ("" if c.feeds() else " (none measured covers it: the data path binds whatever the knobs)"))
    return c


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


def _point_runner(runner: Callable[..., Any], workload: Any, spec: Any, log_dir: Any, space: Any = None) -> Run:
    from pathlib import Path

    from autotune.config import TrialConfig

    def run(config: dict[str, Any], part: str) -> Point:
        fit = getattr(space, "loader", None)  # a data point's prefetch lowered to fit, as the trials' (loader_fit)
        cfg = TrialConfig.from_dict(fit.clamp(config) if fit is not None and part == "data" else config)
        name = f"ceiling-{part}" + (f"-w{cfg.num_workers}" if part == "data" else "") + ".log"
        kw = {"log_path": Path(log_dir) / name} if log_dir is not None else {}
        r = runner(workload, cfg, spec.replace(part=part), **kw)
        if r.user_error:  # the workload's own fault (a collate that raises, a worker that crashes): said, not retried
            from autotune.errors import WorkloadError

            raise WorkloadError(r.reason.removeprefix("WorkloadError: "))
        ok = r.status == "ok" and bool(r.samples_per_s)
        return Point(part=part, config=cfg.to_dict(), samples_per_s=r.median_samples_per_s if ok else 0.0,
                     windows=tuple(r.samples_per_s), rel_iqr=r.summary.rel_iqr if ok else None,
                     cpu_cores_used=r.cpu_cores_used, status=r.status, reason=r.reason)

    return run
