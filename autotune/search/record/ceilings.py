"""The two ceilings of a training step, and the one model of the pipeline that reads them.

A step is a pipeline: the DataLoader makes batches (read, decode, transform, collate, pin, copy) while the model
consumes them; end to end it runs no faster than the slower of the two. Each is measured alone, in a trial child of
its own under the trial's caps (``autotune.trial.parts``):

* **the model**: the workload's step on one batch already on the device, on the best config the search has measured
  so far (the likely winners, else the baseline);
* **the data path**: the workload's own DataLoader with no model, at a few worker counts, climbing as tf.data's
  AUTOTUNE hill-climbs (``search.plan.climb``: which counts, a few children, never one per worker count).

``Ceilings`` holds both and answers "what would this config run at, and why" (``predict``); ``workers_to_feed`` is
the fewest workers whose data rate covers the model (interpolated between the two measured points around it), and
``verdict`` says which ceiling binds a measured config, with the levers beyond the knobs when even every core
cannot feed the model. The planned search reads them through ``feed`` (``coordinate.plan``), the study keeps them
as a user attribute (``CEILINGS``), the recommendation's YAML as ``ceilings:``.

The tuner measures them once, after the baseline and the likely winners, when the baseline waited for data more
than ``INPUT_BOUND_SHARE`` of its step (the TF profiler's "highly input-bound") or the trials run on a GPU (where
the model is often many times faster than one core's data path) and the space searches ``num_workers``
(``search.plan.ceiling_runs``: when; ``search.plan.climb``: which points).
Plumber (MLSys 2022) solves an LP over per-stage rates instead; here every figure is a measurement (one count may
be unmeasured alone, and says so: the one a climb the budget ended was about to measure, ``Ceilings.best_data``).

>>> c = Ceilings(model=Point("model", {"batch_size": 64}, 1000.0),
...              data=(Point("data", {"num_workers": 1}, 300.0), Point("data", {"num_workers": 4}, 1100.0)))
>>> c.workers_to_feed(), round(c.data_rate(2)), c.predict({"num_workers": 2})[1]
(4, 567, 'data')
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optuna import Study

__all__ = ["Point", "Ceilings", "CEILINGS", "FED", "HEADROOM", "INPUT_BOUND_SHARE", "LEVERS", "PLATEAU",
           "offered_workers", "best_point", "fastest_point", "peaked", "plateau", "centre_measured", "feed", "load",
           "store", "recorded", "ceiling_lines"]

CEILINGS = "ceilings"  # the study's user attribute: ``Ceilings.to_dict()``
FED = "fed the model"  # in the ``why`` of ceilings not measured because the likely winners' loader fed it
# The knobs that set the model's own rate: a config that differs in one is not the model ceiling's config
MODEL_KNOBS = ("batch_size", "amp", "channels_last", "compile_mode")
# From this share of a step spent waiting for data a trial ran at its loader's rate: the planned search sizes the
# loader first (``plan.ceiling_runs``; the TF profiler calls a step "highly input-bound" from 20%), and the
# provisional pick reads it (``choose.same_loader``); the per-trial diagnosis says "input-bound" from 30%.
INPUT_BOUND_SHARE = 0.20
# The data path must cover the model's rate by this much: batches come in bursts (a worker hands over a whole
# batch), and a loader exactly as fast as the model leaves it waiting on every hiccup.
HEADROOM = 1.15
# Two points of the data path within this much of each other are not told apart by one process each: a process's own
# level moves 5.1% (sigma; the H200 run's four configs measured twice), so two differ by 7% (sigma) and 10% holds
# most pairs of one rate. The climb's pick is the centre of the points within it of the fastest (``best_point``).
PLATEAU = 0.10
# What buys a faster data path beyond the knobs, each with what it would buy; named when every core cannot feed it.
LEVERS = ("decode on the GPU (torchvision.io.decode_jpeg(device='cuda'), or NVIDIA DALI): takes the decode, "
          "usually most of the data path's CPU, off the cores",
          "cache the decoded, resized tensors (or smaller JPEGs) once, before training: each epoch then pays only "
          "for the augmentation",
          "lighter transforms (a smaller RandomResizedCrop source, fewer augmentations): the data path's cost per "
          "sample falls with them")


@dataclass(frozen=True)
class Point:
    """One ceiling measured alone: ``part`` ("model" or "data"), the config it ran (``TrialConfig.to_dict``), its
    median samples/s (0.0 when it failed), its windows, their relative IQR, the cores its process tree kept busy,
    and how it ended."""

    part: str
    config: dict[str, Any]
    samples_per_s: float
    windows: tuple[float, ...] = ()
    rel_iqr: float | None = None
    cpu_cores_used: float | None = None
    status: str = "ok"
    reason: str = ""

    @property
    def workers(self) -> int:
        return int(self.config.get("num_workers") or 0)

    def to_dict(self) -> dict[str, Any]:
        return {"part": self.part, "config": dict(self.config), "samples_per_s": round(self.samples_per_s, 3),
                "windows": [round(w, 3) for w in self.windows], "rel_iqr": self.rel_iqr,
                "cpu_cores_used": self.cpu_cores_used, "status": self.status, "reason": self.reason}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Point:
        return cls(part=str(d["part"]), config=dict(d.get("config") or {}),
                   samples_per_s=float(d.get("samples_per_s") or 0.0),
                   windows=tuple(float(w) for w in d.get("windows") or ()), rel_iqr=d.get("rel_iqr"),
                   cpu_cores_used=d.get("cpu_cores_used"), status=str(d.get("status", "ok")),
                   reason=str(d.get("reason", "")))

    def line(self) -> str:
        spread = f", IQR {100 * self.rel_iqr:.0f}%" if isinstance(self.rel_iqr, (int, float)) else ""
        cores = f", {self.cpu_cores_used:.1f} cores busy" if isinstance(self.cpu_cores_used, (int, float)) else ""
        if self.status != "ok":
            return f"{self.status}: {self.reason}"
        return f"{self.samples_per_s:.1f} samples/s ({len(self.windows)} windows{spread}{cores})"


@dataclass(frozen=True)
class Ceilings:
    """The model's ceiling and the data path's climb (by workers, in the order measured); ``why``: why they were
    measured (the baseline's wait for data, or a GPU). With ``world_size`` N > 1 DDP ranks each part ran in N ranks
    at once, as the trials do: the rates are all ranks' together, the workers each rank's (the ranks' loaders share
    the host's cores), the cores busy the whole trial's."""

    model: Point | None
    data: tuple[Point, ...] = ()
    why: str = ""
    notes: tuple[str, ...] = field(default=())
    world_size: int = 1
    device: str = "cuda"  # the trials' device family: "cpu" has no GPU to decode on (a record without it: "cuda")
    guess: int | None = None  # a budget skipped the climb: the workers a rank's cores less one give (Lightning's hint)
    cut: int | None = None  # a budget ended the climb before it measured this count (``best_data``)

    @property
    def per_rank(self) -> str:
        """" per rank (N ranks)" after a worker count, with N > 1 ranks; "" with one process."""
        return f" per rank ({self.world_size} ranks)" if self.world_size > 1 else ""

    # --- the model of the pipeline --------------------------------------------------------------------------
    @property
    def model_rate(self) -> float:
        return self.model.samples_per_s if self.model is not None and self.model.status == "ok" else 0.0

    def measured(self) -> list[Point]:
        """The data points that ran, by workers."""
        return sorted((p for p in self.data if p.status == "ok" and p.samples_per_s > 0), key=lambda p: p.workers)

    def data_rate(self, workers: int) -> float | None:
        """The data path's rate at ``workers``: measured, or linear between the two measured points around it;
        beyond the last point, the last point's (the climb stopped there because it stopped growing or covered
        the model); below the first, in proportion to the workers (0 workers: unknown, None)."""
        pts = self.measured()
        if not pts or workers <= 0:
            return None
        for a, b in zip(pts, pts[1:]):
            if a.workers <= workers <= b.workers:
                if b.workers == a.workers:
                    return max(a.samples_per_s, b.samples_per_s)
                f = (workers - a.workers) / (b.workers - a.workers)
                return a.samples_per_s + f * (b.samples_per_s - a.samples_per_s)
        if workers >= pts[-1].workers:
            return pts[-1].samples_per_s
        return pts[0].samples_per_s * workers / max(1, pts[0].workers)

    def best_data(self) -> Point | None:
        """The data path's best point: the measured one ``best_point`` gives, or, where a budget ended the climb
        (``cut``) before the count it was about to measure inside a peak's top and no point measured is within a
        quarter of the top's width of its centre, that count, unmeasured alone (its ``reason`` says so; its rate
        interpolated). The rate is unimodal in the workers, so a count between two points on the top runs at least as
        fast as the slower of them, while either end of a wide top is a noisy pick beside where the rate falls; the
        fed trials then measure it end to end."""
        ok = self.measured()
        best = best_point(ok)
        band = plateau(ok)
        if best is None or self.cut is None or not peaked(ok, band) or any(p.workers == self.cut for p in self.data):
            return best
        lo, hi = band[0].workers, band[-1].workers
        if not lo < self.cut < hi or centre_measured(band):
            return best
        ends = {band[0].config.get("intra_op_threads"), band[-1].config.get("intra_op_threads")}
        config = {**best.config, "num_workers": self.cut}  # the threads both ends ran with, where they agree
        if len(ends) > 1:
            config.pop("intra_op_threads", None)
        return Point("data", config, self.data_rate(self.cut) or 0.0,
                     reason=f"unmeasured alone: the count the climb would have measured next, between {lo} and {hi} "
                            f"workers on the top (within {PLATEAU:.0%} of the fastest), when the budget ended it")

    def workers_to_feed(self, headroom: float = HEADROOM) -> int | None:
        """The fewest workers whose data rate covers the model's with ``headroom``; where none measured does, the
        workers of the data path's best (``best_data``: the data path binds whatever the model does); None when
        nothing ran."""
        pts = self.measured()
        if not pts:
            return None
        target = self.model_rate * headroom
        if target <= 0:
            return self.best_data().workers
        before = None
        for p in pts:
            if p.samples_per_s >= target:
                if before is None or p.workers - before.workers <= 1:
                    return p.workers
                per_worker = (p.samples_per_s - before.samples_per_s) / (p.workers - before.workers)
                if per_worker <= 0:
                    return p.workers
                return min(p.workers, before.workers + math.ceil((target - before.samples_per_s) / per_worker))
            before = p
        return self.best_data().workers

    def unmeasured(self) -> str:
        """Why the data path's best count was not measured alone (the count a climb the budget ended was about to
        measure on a peak's top: ``best_data``); "" when it was."""
        best = None if self.feeds() else self.best_data()
        return best.reason if best is not None and best not in self.data else ""

    def fastest(self) -> Point | None:
        """The fastest data point measured."""
        return fastest_point(self.measured())

    def feeds(self) -> bool:
        """Whether some measured worker count covers the model with headroom."""
        best = self.fastest()
        return best is not None and best.samples_per_s >= self.model_rate * HEADROOM > 0

    def predict(self, config: dict[str, Any]) -> tuple[float | None, str]:
        """``(samples/s, "model" | "data" | "unknown")``: what ``config`` would run at by the ceilings, and which
        binds. With 0 workers the data path runs in the training process, one after the model: the two serialise
        (1 / (1/model + 1/data)), and that is "data" when loading takes longer than the model."""
        workers = int(config.get("num_workers") or 0)
        model = self.model_rate or None
        if workers == 0:
            w0 = next((p.samples_per_s for p in self.measured() if p.workers == 0), None)
            if model is None or w0 is None:
                return None, "unknown"
            return 1.0 / (1.0 / model + 1.0 / w0), "data" if w0 < model else "model"
        data = self.data_rate(workers)
        if model is None or data is None:
            return (model or data), "unknown"
        return min(model, data), "data" if data < model else "model"

    def verdict(self, config: dict[str, Any], measured: float | None) -> str:
        """Which ceiling binds ``config`` (measured end to end at ``measured`` samples/s), in one line."""
        model = self.model
        best = self.fastest()
        workers = int(config.get("num_workers") or 0)
        rate = self.data_rate(workers) if workers else None
        parts = []
        if model is not None and model.status == "ok":
            parts.append(f"the model alone runs {model.samples_per_s:.0f} samples/s "
                         f"(bs={model.config.get('batch_size')}, amp={model.config.get('amp', 'off')})")
        if rate is not None:
            parts.append(f"your data path gives about {rate:.0f} with {workers} worker(s){self.per_rank}")
        elif best is not None:
            parts.append(f"your data path alone measured at most {best.samples_per_s:.0f} (with {best.workers} "
                         f"worker(s){self.per_rank})")
        _, which = self.predict(config)
        same_model = all(config.get(k) == (model.config.get(k) if model else None) for k in MODEL_KNOBS)
        if workers == 0 and same_model and measured and self.model_rate and measured < 0.8 * self.model_rate:
            which_word = ("input-bound: with no workers the loader runs in the training process, between the "
                          "model's steps, and the two costs add up")
        elif measured and self.model_rate and measured < 0.8 * min(self.model_rate, rate or math.inf):
            which_word = "neither ceiling is reached (the two share the cores, or the config differs from the " \
                         "ceilings')"
        else:
            which_word = {"data": "input-bound", "model": "model-bound", "unknown": "which binds is unknown"}[which]
        head = f"{measured:.0f} samples/s end to end: " if measured else ""
        return head + "; ".join(parts) + f": {which_word}"

    def levers(self) -> list[str]:
        """The levers beyond the knobs, when no worker count measured could feed the model (else none; none either
        when the data path never ran, e.g. no worker count fitted the loader's memory)."""
        if self.model_rate <= 0 or self.feeds() or not self.data:  # fed, or the data path never ran: nothing to say
            return []
        best = self.fastest()
        short = f"{best.samples_per_s / self.model_rate:.0%} of the model's rate" if best is not None else "no rate"
        levers = LEVERS if self.device != "cpu" else LEVERS[1:]  # a CPU run has no GPU to decode on
        return [f"even the fastest data path measured ({short}) cannot feed the model: " + lever for lever in levers]

    # --- records ---------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        feed, unmeasured = self.workers_to_feed(), self.unmeasured()
        return {"model": None if self.model is None else self.model.to_dict(),
                "data": [p.to_dict() for p in self.data], "why": self.why, "notes": list(self.notes),
                "workers_to_feed": feed, "headroom": HEADROOM, "world_size": self.world_size, "device": self.device,
                "guess": self.guess, "cut": self.cut,
                **({"unmeasured": unmeasured} if unmeasured else {}),
                "binds": ("unknown" if self.model_rate <= 0 or not self.measured() else
                          "model" if self.feeds() else "data")}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Ceilings | None:
        if not d:
            return None
        return cls(model=Point.from_dict(d["model"]) if d.get("model") else None,
                   data=tuple(Point.from_dict(p) for p in d.get("data") or ()), why=str(d.get("why", "")),
                   notes=tuple(d.get("notes") or ()), world_size=int(d.get("world_size") or 1),
                   device=str(d.get("device") or "cuda"), guess=d.get("guess"), cut=d.get("cut"))

    def lines(self) -> list[str]:
        out = [f"ceilings ({self.why})" if self.why else "ceilings"]
        if self.world_size > 1:
            out.append(f"  each part ran in {self.world_size} DDP ranks at once: samples/s are all ranks' together, "
                       "workers each rank's")
        if self.model is not None:
            out.append(f"  model alone   {self.model.line()}  [{_short(self.model.config)}]")
        for p in self.data:
            out.append(f"  data path w={p.workers:<3} {p.line()}  [{_short(p.config)}]")
        feed = self.workers_to_feed()
        if feed is not None:
            out.append(f"  fewest workers to feed the model (x{HEADROOM} headroom): {feed}{self.per_rank}"
                       + ("" if self.feeds() else " (none measured covers it: the data path binds)"))
            unmeasured = self.unmeasured()
            if unmeasured:
                out.append(f"  {feed} worker(s){self.per_rank}: {unmeasured}")
        return out


def _short(config: dict[str, Any]) -> str:
    from autotune.config import TrialConfig

    try:
        return TrialConfig.from_dict(config).short()
    except Exception:  # noqa: BLE001 - a config from another version: shown as stored
        return ", ".join(f"{k}={v}" for k, v in config.items())


def offered_workers(choices: tuple[int, ...] | list[int]) -> list[int]:
    """The worker counts above 0 the space offers, in order.

    >>> offered_workers(range(0, 4)), offered_workers([0])
    ([1, 2, 3], [])
    """
    return sorted({int(c) for c in choices if int(c) > 0})


def load(study: Study) -> Ceilings | None:
    return Ceilings.from_dict(study.user_attrs.get(CEILINGS))


def store(study: Study, ceilings: Ceilings) -> None:
    study.set_user_attr(CEILINGS, ceilings.to_dict())


def feed(study: Study, space: Any) -> dict[str, Any] | None:
    """The loader knobs the planned search gives every config from now on (``coordinate.plan``), from the stored
    ceilings: the workers to feed the model, the pinned memory, persistent workers and prefetch the data path ran
    with, and the intra-op threads its training process had at that count (the climb measured the training process
    the fed configs will have: ``ceiling_runs``), each where the space offers it; None without ceilings, or when the
    space does not search ``num_workers``. Ceilings a budget skipped give their ``guess`` (unmeasured, but an
    input-bound baseline's first trials still get workers)."""
    c = load(study)
    if c is None:
        return None
    workers = c.workers_to_feed() or (c.guess if not c.data else None)
    choices = {p.name: p.choices for p in space.params}
    offered = offered_workers(choices.get("num_workers", ()))
    if not workers or not offered:
        return None
    workers = next((w for w in offered if w >= workers), offered[-1])  # a space's [0, 2, 4, 8] has no 3
    out: dict[str, Any] = {"num_workers": workers}
    best = c.best_data()  # unmeasured alone where a budget ended the climb: the threads both ends of the top ran
    at = next((p for p in c.measured() if p.workers == workers), best if best and best.workers == workers else None)
    ref = (at or best or c.data[0]).config if c.data else {"pin_memory": True, "persistent_workers": True}
    knobs = ("pin_memory", "persistent_workers", "prefetch_factor") + (("intra_op_threads",) if at else ())
    for knob in knobs:
        if ref.get(knob) is not None and ref.get(knob) in choices.get(knob, ()):
            out[knob] = ref[knob]
    return out


def best_point(ok: list[Point], tolerance: float = PLATEAU) -> Point | None:
    """The data path's best count among ``ok``, measured. Where it peaks (``plateau``: a point above its top measured
    below it), the point nearest the centre of the top, the faster of two as near: on a peak a point's own noise (a
    process's level: 5% sigma on the H200) decides which is fastest, and the centre is the count farthest from both
    sides where the rate falls (the climb measures it: ``climb._centre``; where a budget ended the climb first,
    ``Ceilings.best_data`` gives the count it would have measured). Else (it still rises, or stays flat, at the most
    workers measured) the fastest, the fewest workers among equals (more only take memory, shared memory and cores
    from the training process); not the fewest within the noise of it, which picks a count on the rise that
    measured high.

    >>> p = lambda w, r: Point("data", {"num_workers": w}, r)
    >>> best_point([p(1, 336.0), p(16, 3570.0), p(22, 4091.0), p(36, 4080.0), p(63, 2814.0)]).workers
    22
    >>> best_point([p(1, 310.0), p(15, 3368.0), p(19, 3517.0), p(28, 3480.0), p(37, 3600.0), p(63, 2720.0)]).workers
    28
    >>> best_point([p(1, 300.0), p(3, 650.0), p(20, 650.0), p(64, 650.0)]).workers  # flat to the last: the fewest
    3
    """
    band = plateau(ok, tolerance)
    if not band:
        return None
    if not peaked(ok, band):
        return fastest_point(ok)
    centre = (band[0].workers + band[-1].workers) / 2
    return min(band, key=lambda p: (abs(p.workers - centre), -p.samples_per_s, p.workers))


def fastest_point(ok: list[Point]) -> Point | None:
    """The fastest of ``ok``, the fewest workers among equals; None without any."""
    return max(ok, key=lambda p: (p.samples_per_s, -p.workers)) if ok else None


def peaked(ok: list[Point], band: list[Point]) -> bool:
    """Whether the data path peaks at its top ``band`` (``plateau``): a point above it measured below it."""
    return bool(band) and any(p.workers > band[-1].workers for p in ok)


def centre_measured(band: list[Point]) -> bool:
    """Whether a point of the top ``band`` (``plateau``) lies within a quarter of the top's width of its centre (or
    the top is too narrow to have a count between its ends): then the measured pick stands (``climb._centre``
    measures one there; ``Ceilings.best_data`` keeps a cut climb's count only without one)."""
    lo, hi = band[0].workers, band[-1].workers
    return hi - lo < 2 or any(abs(p.workers - (lo + hi) / 2) <= (hi - lo) / 4 for p in band)


def plateau(ok: list[Point], tolerance: float = PLATEAU) -> list[Point]:
    """The points of ``ok`` on the data path's top, by workers: from the fewest to the most workers that ran within
    ``tolerance`` of the fastest, and every point between them (the rate is unimodal in the workers: one that
    measured lower between two on the top measured low)."""
    if not ok:
        return []
    top = max(p.samples_per_s for p in ok)
    near = [p.workers for p in ok if p.samples_per_s >= (1 - tolerance) * top]
    return sorted((p for p in ok if min(near) <= p.workers <= max(near)), key=lambda p: p.workers)


def recorded(study: Study, rec: Any) -> Any:
    """``rec`` (a Recommendation) with what the study knows of its data path: the loader's memory
    (``loader_statement``: what it holds in flight, whether it fits, what more would buy) and the study's ceilings,
    the verdict on its config and the levers (without ceilings, those are left out)."""
    from autotune.search.record.loader_statement import recorded as with_loader_memory

    rec = with_loader_memory(study, rec)
    c = load(study)
    if c is None:
        return rec
    if c.model is None and not c.data:  # skipped (the budget): said, not guessed
        verdict = c.why if c.why.startswith("not measured") else f"not measured ({c.why})"
        if c.guess and FED not in c.why:
            verdict += f"; the loader got {c.guess} worker(s) unmeasured (a rank's cores less one)"
        return dataclasses.replace(rec, ceilings={**c.to_dict(), "verdict": verdict, "levers": []})
    record = {**c.to_dict(), "verdict": c.verdict(rec.config.to_dict(), rec.median_samples_per_s),
              "levers": c.levers()}
    untried = _untried(study, c, rec)
    if untried:  # the budget cut the trials that would have run the ceilings' count: said, with the count
        record["untried"] = untried
        return dataclasses.replace(rec, ceilings=record, notes=rec.notes + (untried,))
    return dataclasses.replace(rec, ceilings=record)


def _untried(study: Study, c: Ceilings, rec: Any) -> str:
    """A line when no search trial ran the workers the ceilings give end to end (a budget cut the fed trials) and
    the recommendation runs others; "" otherwise."""
    from autotune.search.record import trials as keys

    feed = c.workers_to_feed()
    if feed is None or rec.config.num_workers == feed:
        return ""
    for t in study.get_trials(deepcopy=False):
        config = keys.config_of(t) if t.user_attrs.get(keys.STATUS) == "ok" else None
        if config is not None and config.num_workers == feed:
            return ""  # run end to end, and beaten
    what = "the fewest that feed the model" if c.feeds() else "the data path's best"
    how = (f"gave {feed} worker(s){c.per_rank} (unmeasured alone: the climb's next count when the budget ended it)"
           if c.unmeasured() else f"measured {feed} worker(s){c.per_rank}")
    return (f"the ceilings {how} as {what}; no search trial ran them end to end "
            f"before the budget ended, so the recommendation runs {rec.config.num_workers}: try num_workers={feed}, "
            "or give a longer --timeout")


def ceiling_lines(ceilings: dict | None) -> list[str]:
    """What a person reads of a recommendation's ``ceilings`` (its stored dict): which binds, then the levers."""
    if not ceilings:
        return []
    unmeasured = ([f"  the data path's best, {ceilings.get('workers_to_feed')} worker(s)"
                   f"{Ceilings.from_dict(ceilings).per_rank}: {ceilings['unmeasured']}"]
                  if ceilings.get("unmeasured") else [])
    return ([f"ceilings: {ceilings['verdict']}"] if ceilings.get("verdict") else []) + unmeasured + \
        [f"  lever: {lever}" for lever in ceilings.get("levers") or ()]
