"""The planned search: before the sampler takes over, walk the batch size, take the likely-winner bundle apart at the
batch found, then try the space's other knobs one at a time.

Why: trial 1 switches the usual winners on together (bf16, channels_last, ``malloc: retain``). When one of them hurts on
this model and machine (bf16 where it is no faster than fp32, say), the bundle runs about as fast as the defaults and
hides the others' gain, and a walk and a sampler that start from it keep the harm. So each bundle member is measured
apart, whichever way the evidence makes more informative:

* the bundle beat the baseline by more than the noise: the bundle with that knob **reverted** (leave one out:
  near the best config so far, each probe says what one knob adds there);
* otherwise (a loss, the bundle failed, a tie where the batch did not move; a tie measures the bundle again at the
  walked batch first): the baseline with that knob **alone** (add one in: each probe says what it does by itself).

Either way the batch is walked first (``walk_first``). The knobs that helped are combined (one more trial, unless
measured already) and the best config measured so far is kept (an earlier study's winner, ``warm_start``, among them);
where that is off the walked line, the walk (``batch_walk``) goes on from it. Then one coordinate step: each other knob
in the space's order (``likely.sweep_order``; compile last, ``compile_last``), its other values measured on the best
config so far, the best of them kept if it beats it. Only then does the sampler (TPE) take over.

Noise: a candidate beats the incumbent when its median is above it by more than the noise (``noise.single_noise``: the
study's window spread or the gaps of the plan's repeats, at least 5%; fixed once both are measured). Within the noise
above it both are measured once more, side by side (``repeat_of``; by turns where they may, ``backends.pairs``), each
comparison its own pair (``round_of``: an incumbent measured twice already is measured again beside the candidate's
repeat, not read from another comparison's round minutes before), and the candidate wins only if the second round,
paired, is above 1 too and the two rounds' mean log ratio clears ``noise.REPEAT_Z`` standard errors of one comparison of
fresh processes (``noise.repeat_keeps``; docs/search.md: the rule before, Student's t over two rounds, kept no-ops that
agreed). A candidate at or below the incumbent is not repeated. A comparison reads each config's first measurement and
its own second round: no later repeat reopens it. One within the noise below it is out of the plan on that one draw,
and the log says so (``Plan.one_draw``); below the plan's best, it gets a finalists' round (``contenders.near_misses``).

``plan`` is a pure function of the study's trials, worked out afresh after every trial as the batch walk is: the order
in which trials finish, a resumed run, or several workers change nothing; what it lacks is queued once (``Plan.needs``).

>>> p = plan(space, study.get_trials(), noise=0.05)    # doctest: +SKIP
>>> p.phase, p.incumbent, [n.roles for n in p.needs]   # doctest: +SKIP
('separate', {...}, [{'knob_step': 'amp=off'}, {'knob_step': 'channels_last=False'}])
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from autotune.search.record import trials as keys
from autotune.search.plan.batch_walk import next_steps, walked
from autotune.config import device_family
from autotune.measure import NOISY_REL_IQR
from autotune.search.plan.noise import comparison_sd, repeat_keeps, single_noise
from autotune.search.record.trials import MemoryLimit, config_of, is_feasible, knobs_apart
from autotune.search.record.untried import OneDraw
from autotune.search.space.complete import complete
from autotune.search.space.likely import sweep_order

__all__ = ["Measured", "Need", "Plan", "plan", "measurements", "candidates", "MAX_TRIED", "NOT_SWEPT"]

# An integer knob with more choices than this (threads, workers on a large machine): half, double, its ends only.
MAX_TRIED = 4
# Knobs the coordinate step leaves alone: the batch walk covers the batch size, and compile is tried last.
NOT_SWEPT = ("batch_size", "compile_mode")

@dataclass(frozen=True)
class Measured:
    """One measurement of a config: its trial, its median (0.0 when it failed, was pruned or does not fit the
    memory limit), its windows and their relative IQR (None when unknown); for a repeat, the comparison it is the
    second round of (``keys.ROUND_OF``) and whether it ran by turns beside the other config (``keys.BY_TURNS``)."""

    number: int
    value: float
    windows: tuple[float, ...]
    rel_iqr: float | None = None
    round_of: str | None = None
    by_turns: bool = False
    legacy: bool = False  # a repeat from before ``round_of`` (a study older than 2026-11-30's evening)


@dataclass(frozen=True)
class Need:
    """A trial the plan needs and the study lacks: its params, the roles to queue it with, a line for the log."""

    params: dict[str, Any]
    roles: dict[str, Any]
    why: str


@dataclass
class Plan:
    """Where the planned search stands: ``phase`` (``bundle``: waiting for the baseline and the likely winners;
    ``separate``, ``warm``, ``walk``, ``sweep``; ``done``: the sampler's), the best config so far (None before the
    first measurement, or when neither baseline nor bundle ran), the trials to queue now, the decisions in order."""

    phase: str
    incumbent: dict[str, Any] | None
    needs: list[Need] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    one_draw: list[OneDraw] = field(default_factory=list)  # put out by one trial within the noise below

    done = property(lambda self: self.phase == "done")

    def label(self) -> str:
        """For the progress bar."""
        return {"bundle": "baseline and likely winners", "separate": "likely winners one at a time", "warm":
                "earlier studies' winners", "walk": "batch walk", "sweep": "one knob at a time", "done": "sampler"}[
            self.phase]


def candidates(param, current: Any) -> list[Any]:
    """The values of ``param`` the coordinate step tries instead of ``current``: every other choice, or for an integer
    knob with more than ``MAX_TRIED`` choices the ones nearest half and double the current value and the two ends.

    >>> from autotune.search.space.search_space import Param
    >>> candidates(Param("intra_op_threads", "int", tuple(range(1, 65))), 16)
    [1, 8, 32, 64]
    """
    others = [c for c in param.choices if c != current]
    if param.type != "int" or len(param.choices) <= MAX_TRIED or not isinstance(current, int):
        return others
    near = [min(param.choices, key=lambda c: (abs(c - target), c)) for target in (current / 2, current * 2)]
    return sorted({c for c in [min(param.choices), max(param.choices), *near] if c != current})


def measurements(trials: Iterable, space, *, limit: MemoryLimit | None = None, fingerprint: str | None = None):
    """``(by_key, present, roles)`` from a study's trials: each config's measurements in trial order, how many trials
    (any state, copies left out) each config has (and each ``(key, round_of)`` of a repeat), and the params of the first
    finished baseline and likely-winner trials and of the warm starts (``roles[key]``: a list of params)."""
    from optuna.trial import TrialState

    by_key: dict[tuple, list[Measured]] = {}
    present: Counter = Counter()
    roles: dict[str, list[dict[str, Any]]] = {keys.BASELINE: [], keys.LIKELY_WINNER: [], keys.WARM_START: []}
    for t in sorted(trials, key=lambda t: t.number):
        ua = t.user_attrs
        config = config_of(t, space)
        if config is None or ua.get(keys.DUPLICATE_OF) is not None:
            continue
        if fingerprint and ua.get(keys.FINGERPRINT, fingerprint) != fingerprint:
            continue  # another kind of machine's figures
        finished = t.state.is_finished()
        if finished and (ua.get(keys.STATUS) in keys.NOT_MEASURED or (limit is not None and not limit.binds(t))):
            continue  # stopped (its retry is queued), or killed under a lower cap than now: as if never tried
        key = config.key()
        present[key] += 1
        if ua.get(keys.ROUND_OF) is not None:
            present[(key, ua[keys.ROUND_OF])] += 1
        params = dict(t.params) if t.params else dict(t.system_attrs.get(keys.FIXED_PARAMS) or {})
        for role, found in roles.items():
            if ua.get(role) and (finished or role == keys.WARM_START):
                found.append(params)
        if finished:
            ok = t.state == TrialState.COMPLETE and ua.get(keys.STATUS) == "ok" and is_feasible(t, limit)
            value = float(t.value or 0.0) if ok else 0.0
            windows = tuple(float(x) for x in (ua.get(keys.SAMPLES) or ())) or (value,)
            spread = ua.get(keys.REL_IQR) if isinstance(ua.get(keys.REL_IQR), (int, float)) else None
            by_key.setdefault(key, []).append(Measured(  # legacy: a repeat from before ``round_of``
                t.number, value, windows if ok else (0.0,), spread, ua.get(keys.ROUND_OF), keys.BY_TURNS in ua,
                ua.get(keys.REPEAT_OF) is not None and ua.get(keys.ROUND_OF) is None))
    return by_key, present, roles


def plan(space, trials: Iterable, *, noise: float = NOISY_REL_IQR, limit: MemoryLimit | None = None,
         fingerprint: str | None = None, feed: dict[str, Any] | None = None) -> Plan:
    """Where the planned search stands, and what to queue now (module docstring). ``noise``: the floor of the
    noise a gain must clear (each comparison uses the median window spread of the trials up to its own).
    ``feed``: the loader knobs that feed the model (``ceilings.feed``, from the study's measured ceilings): once
    the baseline and the likely winners ran, both get them, and the search goes on from there."""
    trials = list(trials)
    by_key, present, roles = measurements(trials, space, limit=limit, fingerprint=fingerprint)
    replay = _Replay(space, by_key, present, noise, feed=feed)
    try:
        incumbent = replay.run(roles)
        phase = "done"
    except _Wait:
        incumbent, phase = replay.incumbent, replay.phase
    return Plan(phase, incumbent, replay.needs, replay.notes, replay.one_draw)


class _Wait(Exception):
    """The plan needs a measurement the study does not have yet."""


class _Replay:
    """The planned search, replayed from the start over what the study measured: each step reads the measurements
    it needs, or records them as needed and stops (``_Wait``)."""

    def __init__(self, space, by_key: dict[tuple, list[Measured]], present: Counter, noise: float, *,
                 feed: dict[str, Any] | None = None) -> None:
        self.space, self.by_key, self.present, self.floor, self.feed = space, by_key, present, noise, feed
        self.spreads = sorted((m.number, m.rel_iqr) for ms in by_key.values() for m in ms if m.rel_iqr is not None)
        # each config measured twice in fresh processes (the plan's repeats): the later trial, and how far apart
        self.repeats = sorted((b.number, abs(math.log(b.value / a.value)))
                              for a, b in (ms[:2] for ms in by_key.values() if len(ms) >= 2) if a.value > 0 < b.value)
        self.needs: list[Need] = []
        self.notes: list[str] = []
        self.one_draw: list[OneDraw] = []  # ``Plan.one_draw``
        self.phase = "bundle"
        self.incumbent: dict[str, Any] | None = None
        self.tested: set[tuple[str, Any]] = set()  # (knob, value) pairs the bundle's separation measured
        self._asked: set[tuple] = set()
        self.seen = -1  # the latest trial a decision so far has read
        self.why: dict[tuple, str] = {}  # a line for the log of a trial to queue, where it says more than its knobs
        self.steps: dict[tuple, str] = {}  # the role of a trial to queue that has none of its own (keys.PLAN_STEP)

    # --- reading measurements -----------------------------------------------------------------------
    def key(self, params: dict[str, Any]) -> tuple:
        return self.space.effective(complete(self.space, params)).key()

    def get(self, group: list[tuple[dict[str, Any], dict[str, Any]]],
            round_of: str | None = None) -> list[list[Measured]]:
        """The first measurement of each ``(params, roles)``, or with ``round_of`` its repeat in that comparison's
        second round; what is missing is queued (a repeat carries ``repeat_of`` and ``round_of``) and the replay
        waits for all of the group at once (several workers, or a pair by turns, run them side by side)."""
        out, missing = [], False
        for params, roles in group:
            key = self.key(params)
            got = [m for m in self.by_key.get(key, []) if round_of is None or m.round_of == round_of][:1]
            if got:
                out.append(got)
                self.seen = max(self.seen, got[0].number)
                continue
            missing, ask = True, key if round_of is None else (key, round_of)
            got = self.by_key.get(key, [])
            if self.present[ask] < 1 and ask not in self._asked:
                self._asked.add(ask)
                extra = {keys.REPEAT_OF: got[0].number, keys.ROUND_OF: round_of} if round_of else {}
                if not roles and not extra:  # every trial the plan queues says why (`show`, convergence.PLANNED_ROLES)
                    extra = {keys.PLAN_STEP: self.steps.get(key, "planned")}
                label = self.describe(params)
                pair = f", round 2 of trials {round_of.replace('/', ' and ')}" if round_of else ""
                why = (f"measuring {label} again (trial {got[0].number}{pair}): within the noise of the best so far"
                       if got else self.why.get(key, f"queued: {label}"))
                self.needs.append(Need(complete(self.space, params), {**roles, **extra}, why))
        if missing:
            raise _Wait
        return out

    def apart(self, params: dict[str, Any]) -> dict[str, Any]:
        """The knobs ``params`` changes from the best so far (else from the baseline), with their values."""
        a, ref = self.space.effective(params), self.incumbent or self.space.baseline_params()
        return {k: getattr(a, k) for k in knobs_apart(a, self.space.effective(ref))}

    def describe(self, params: dict[str, Any]) -> str:
        """A config as the knobs it changes from the best so far (else from the baseline)."""
        return ", ".join(f"{k}={v}" for k, v in self.apart(params).items()) or self.space.effective(params).short()

    def better(self, cand: dict[str, Any], inc: dict[str, Any], roles: dict[str, Any] | None = None) -> bool:
        """Whether ``cand`` beats ``inc`` beyond the noise (module docstring); both are measured."""
        if self.key(cand) == self.key(inc):
            return False
        (a,), (b,) = self.get([(cand, roles or {}), (inc, {})])
        if a.value <= 0 or b.value <= 0:
            return a.value > 0
        ratio, noise = a.value / b.value, self.noise_at(max(a.number, b.number))
        if 1 / (1 + noise) < ratio <= 1:  # one draw decides it, and says so (2026-11-30g: bf16 at -2.1%)
            self.one_draw.append(OneDraw(self.apart(cand), ratio - 1, self.key(cand), self.key(inc)))
            self.notes.append(f"{self.describe(cand)}: {100 * (ratio - 1):+.1f}% once, within the noise "
                              f"({100 * noise:.0f}%) but not above: decided on this one trial, the config before "
                              "stays (a near miss of the plan's best may get a finalists' round)")
        if ratio > 1 + noise or ratio <= 1:
            return ratio > 1
        old = self.by_key[self.key(cand)][1:2] + self.by_key[self.key(inc)][1:2]  # a study from before ``round_of``:
        if len(old) == 2 and old[0].legacy:  # its decision read each config's second measurement, as it still does
            a2, b2 = old
            self.seen = max(self.seen, a2.number, b2.number)
        else:
            (a2,), (b2,) = self.get([(cand, roles or {}), (inc, {})], round_of=f"{a.number}/{b.number}")
        if a2.value <= 0 or b2.value <= 0:
            return False  # a repeat failed or was pruned: no gain shown
        logs = [math.log(a.value / b.value), math.log(a2.value / b2.value)]
        won, bar = repeat_keeps(logs, comparison_sd(*self.upto(max(a2.number, b2.number)), self.floor))
        again = "again, by turns" if a2.by_turns and b2.by_turns else "again, not by turns"
        self.notes.append(f"{self.describe(cand)}: {100 * (ratio - 1):+.1f}% once, within the noise "
                          f"({100 * noise:.0f}%); {again}, {100 * math.expm1(logs[1]):+.1f}%; over both "
                          f"rounds {100 * math.expm1(sum(logs) / 2):+.1f}%, against the {100 * math.expm1(bar):.1f}% "
                          "a gain must clear: " + ("kept" if won else "not shown, the config before stays"))
        return won

    def upto(self, number: int) -> tuple[list[float], list[float]]:
        """The window spreads and the repeats' gaps of the trials up to ``number`` (``noise``)."""
        return [s for n, s in self.spreads if n <= number], [g for n, g in self.repeats if n <= number]

    def noise_at(self, number: int) -> float:
        """The bar of a single trial's comparison as of trial ``number`` (``noise.single_noise``)."""
        return single_noise(*self.upto(number), self.floor)

    def value(self, params: dict[str, Any]) -> float:
        return self.by_key[self.key(params)][0].value

    # --- the phases ---------------------------------------------------------------------------------
    def run(self, roles: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
        if not roles[keys.BASELINE]:
            raise _Wait  # queued with the study (study_queue.queue_first_trials)
        base, likely = roles[keys.BASELINE][0], None
        if self.space.likely_params() is not None:
            if not roles[keys.LIKELY_WINNER]:
                raise _Wait
            likely = roles[keys.LIKELY_WINNER][0]
        if self.feed:
            fed_base, fed_likely = self.fed(base, likely)
            if not self.feed_lost((base, fed_base), (likely, fed_likely)):
                base, likely = fed_base, fed_likely
        if likely is not None:
            base, likely = self.walk_first(base, likely)
        inc = self.separate(base, likely)
        if inc is None:
            return None
        self.incumbent, self.phase = inc, "warm"
        for params in roles[keys.WARM_START]:  # an earlier study's winner that beats it is a better start
            if self.better(params, inc):
                self.notes.append(f"the warm start {self.describe(params)} beat the best so far: the walk starts there")
                inc = self.incumbent = params
        inc = self.incumbent = self.walk(inc)
        return self.sweep(inc)

    def fed(self, base: dict[str, Any], likely: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The baseline and the likely winners with the loader that feeds the model (``self.feed``), after both
        ran as they are: the data path binds, so every comparison from here on runs fed (``search.record.ceilings``)."""
        self.get([(base, {})] + ([(likely, {})] if likely is not None else []))
        loader = ", ".join(f"{k}={v}" for k, v in self.feed.items())
        self.notes.append(f"from here every config runs with the loader the ceilings give ({loader}; "
                          "search.record.ceilings)")
        out = []
        for params, what in ((base, "the baseline"), (likely, "the likely winners")):
            if params is None:
                out.append(None)
                continue
            p = complete(self.space, {**params, **self.feed})
            self.why.setdefault(self.key(p), f"queued: {what} with the loader the ceilings give ({loader})")
            self.steps.setdefault(self.key(p), f"{what.removeprefix('the ')}, fed")
            out.append(p)
        return out[0], out[1]

    def feed_lost(self, *pairs: tuple[dict[str, Any] | None, dict[str, Any] | None]) -> bool:
        """Whether the loader the ceilings give lost: each config ``(as it ran, fed)`` measured fed, none of them
        within the noise of itself as it ran (pruned or failed fed: lost). On 2 cores a worker takes the training
        process's second thread: resnet18's baseline, input-bound at 20% of its step, ran x0.75 fed (2026-11-29)."""
        pairs = tuple((a, f) for a, f in pairs if a is not None)
        got = self.get([(f, {}) for _, f in pairs])
        ran = self.get([(a, {}) for a, _ in pairs])
        worse = []
        for ((a, f), (mf,), (ma,)) in zip(pairs, got, ran):
            noise = self.noise_at(max(ma.number, mf.number))
            if ma.value <= 0 or mf.value * (1 + noise) >= ma.value:
                return False  # fed, it held (or the config ran no better unfed): the feed stays
            worse.append(mf.value / ma.value)
        loader = ", ".join(f"{k}={v}" for k, v in self.feed.items())
        self.notes.append(f"the loader the ceilings give ({loader}) ran slower: "
                          + ", ".join(f"x{r:.2f}" if r > 0 else "did not run to the end" for r in worse)
                          + " of the same config as it ran before, beyond the noise: the search goes on without it")
        return True

    def walk_first(self, base: dict[str, Any], likely: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The batch walk goes first (the largest lever on a GPU and often on a CPU; a short budget that separated
        first reached the walk last or never: ``benchmarks/keep_rule.py --batch-curve``, the pick's true rate 0.82-0.84
        of the best before, 0.85-0.93 after), from the bundle where it beat the baseline beyond the noise (on a GPU,
        came within it), else from the baseline (which no knob can harm). Where the bundle won, its knobs are reverted
        at the walked batch beside the baseline moved there; where it tied, it runs again at that batch and is taken
        apart there (docs/search.md: resnet18 at 32 px, 2026-11-29); where it lost, each knob is tried alone on the
        baseline at that batch (``run`` walks on where the knobs move the best)."""
        b, lw = (m[0] for m in self.get([(base, {}), (likely, {})]))
        noise = self.noise_at(max(b.number, lw.number))
        won = lw.value > 0 and b.value > 0 and lw.value > b.value * (1 + noise)
        if not won and b.value <= 0:
            return base, likely
        # a tie goes to the bundle on a GPU (bf16 and channels_last on tensor cores, the prior; a loader that binds
        # hides their gain until it is fed: gpu_host_sim's fresh seeds 100 -> 110 of 120 cells at 0.95 in 3
        # minutes), to the baseline on a CPU (where bf16 wins on one kind and loses on another)
        ahead = won or (device_family(self.space.device) == "cuda" and lw.value * (1 + noise) >= b.value > 0)
        start = self.incumbent = likely if ahead else base
        walked = self.walk(start)
        if walked.get("batch_size") == start.get("batch_size"):
            return base, likely
        if (not ahead and lw.value > 0 and lw.value * (1 + noise) >= b.value
                and likely.get("batch_size") != walked["batch_size"]):
            # a tie at one batch need not be one at another: the bundle again there (the docstring's example)
            moved = complete(self.space, {**likely, "batch_size": walked["batch_size"]})
            self.why.setdefault(self.key(moved), f"queued: the likely winners at batch {walked['batch_size']}")
            self.steps.setdefault(self.key(moved), f"likely winners at batch {walked['batch_size']}")
            self.notes.append(f"the likely winners came within the noise of the baseline: the walk went from the "
                              f"baseline first, to batch {walked['batch_size']}, where they run again")
            return walked, moved
        if not ahead:
            self.notes.append(f"the likely winners did not beat the baseline beyond the noise: the walk went from "
                              f"the baseline first, to batch {walked['batch_size']}, where each of them is tried "
                              "alone")
            return walked, likely
        self.notes.append(("the likely winners won" if won else "the likely winners came within the noise of the "
                           "baseline, on a GPU")
                          + f": their knobs are taken apart at batch {walked['batch_size']}, where the walk from "
                          "them went")
        moved = complete(self.space, {**base, "batch_size": walked["batch_size"]})
        self.why.setdefault(self.key(moved), f"queued: the baseline at batch {walked['batch_size']}, beside the likely "
                                             "winners there")
        self.steps.setdefault(self.key(moved), f"baseline at batch {walked['batch_size']}")
        return moved, walked

    def separate(self, base: dict[str, Any], likely: dict[str, Any] | None) -> dict[str, Any] | None:
        """The bundle taken apart (module docstring); returns the best config measured, None when neither the
        baseline nor the bundle ran."""
        group = [(base, {})] + ([(likely, {})] if likely is not None else [])
        measured = [m[0] for m in self.get(group)]
        b = measured[0]
        if likely is None:
            return base if b.value > 0 else None
        lw = measured[1]
        if b.value <= 0 and lw.value <= 0:
            self.notes.append("neither the baseline nor the likely winners ran to the end (pruned as far slower, "
                              "failed, or over the memory limit): the sampler takes over")
            return None
        self.incumbent = base
        # the batch is the walk's: where it moved the baseline first, the bundle stays where it was measured
        members = [p.name for p in self.space.params
                   if p.name != "batch_size" and likely.get(p.name) != base.get(p.name)]
        self.tested = {(k, v) for k in members for v in (base.get(k), likely.get(k))}
        revert = lw.value > 0 and (b.value <= 0 or lw.value > b.value * (1 + self.noise_at(max(b.number, lw.number))))
        at = (f" at batch {base['batch_size']} (they ran at {likely['batch_size']})" if "batch_size" in base
              and base.get("batch_size") != likely.get("batch_size") else "")
        outcome = (f"ran {lw.value / b.value:.2f}x the baseline{at}" if b.value > 0 and lw.value > 0 else
                   "ran, the baseline did not" if lw.value > 0 else
                   "did not run to the end (pruned as far slower, failed, or over the memory)")
        if len(members) < 2:
            return likely if self.better(likely, base) else base
        self.phase = "separate"
        ref = likely if revert else base
        probes = [(k, complete(self.space, {**likely, k: base.get(k)} if revert else {**base, k: likely[k]}))
                  for k in members]
        self.notes.append(f"the likely winners ({self.describe(likely)}) {outcome}: "
                          + ("each is reverted from them in turn" if revert else "each is tried alone on the baseline"))
        self.incumbent = ref
        self.get([(p, {keys.KNOB_STEP: f"{k}={p.get(k)}"}) for k, p in probes])
        # revert: the knobs whose reverting beat the bundle come out; add: the knobs that beat the baseline go in
        moved = [k for k, p in probes if self.better(p, ref, {keys.KNOB_STEP: f"{k}={p.get(k)}"})]
        combined = complete(self.space, {**ref, **{k: (base if revert else likely).get(k) for k in moved}})
        self.notes.append(("reverting " if revert else "alone, ") + (", ".join(moved) or "none of them")
                          + (" helped" if moved else " beat " + ("the bundle" if revert else "the baseline")
                             + " beyond the noise"))
        inc = ref
        others = [base if revert else likely] + [p for _, p in probes]
        if len(moved) > 1:  # the gains combined: one more trial unless measured already
            others.insert(0, combined)
            self.get([(combined, {keys.KNOB_STEP: "combined: " + ", ".join(f"{k}={combined.get(k)}" for k in moved)})])
        for cand in sorted(others, key=self.value, reverse=True):  # the likeliest winner is compared first
            if self.better(cand, inc):
                inc = self.incumbent = cand
        self.notes.append(f"best of the bundle's separation: {self.space.effective(inc).short()} "
                          f"({self.value(inc):.1f} samples/s)")
        return inc

    def walk(self, inc: dict[str, Any]) -> dict[str, Any]:
        """The batch-size walk from ``inc`` (``batch_walk``), decided on each config's first measurement;
        returns the best config on its line if it beats ``inc``."""
        if self.space.batch_step(inc, -1) is None and self.space.batch_step(inc, 1) is None:
            return inc
        self.phase = "walk"
        first = {k: ms[0].value for k, ms in self.by_key.items() if ms}
        present = {k for k, n in self.present.items() if n}
        # a step within the noise of the best on its line looks one further (batch_walk); the noise as of the
        # trials the decisions before the walk read (the plan's repeats among them), so later trials do not change it
        at = self.by_key.get(self.key(inc))
        noise = self.noise_at(max(self.seen, at[0].number if at else -1))
        steps = next_steps(inc, self.space, first, present, noise=noise)
        if steps:
            self.why.update({self.key(s.params): s.why() if s.after_batch != inc.get("batch_size") else
                             f"batch walk from the best config so far: batch {s.params['batch_size']}" for s in steps})
            self.get([(s.params, {keys.BATCH_LINE: s.direction}) for s in steps])
        over, line = walked(inc, self.space, first, noise=noise)
        if not over:
            raise _Wait  # a step is queued or running
        best = max(line, key=self.value)
        if best is not inc and self.better(best, inc):
            self.notes.append(f"batch walk: batch {best['batch_size']} ({self.value(best):.1f} samples/s) is the "
                              f"best on the line from batch {inc['batch_size']}")
            return best
        return inc

    def sweep(self, inc: dict[str, Any]) -> dict[str, Any]:
        """One coordinate step over the knobs the separation and the walk left (module docstring)."""
        self.phase = "sweep"
        for p in sweep_order(self.space):  # the space's order, a CPU kind's widest lever first (likely.yaml)
            if p.name in NOT_SWEPT or p.name not in complete(self.space, inc):
                continue
            self.incumbent = inc
            values = [v for v in candidates(p, inc.get(p.name)) if (p.name, v) not in self.tested]
            group, seen = [], {self.key(inc)}
            for v in values:
                params = complete(self.space, {**inc, p.name: v})
                if self.key(params) not in seen:  # clamping may make it the incumbent or another candidate
                    seen.add(self.key(params))
                    group.append((params, {keys.KNOB_STEP: f"{p.name}={v}"}))
            if not group:
                continue
            self.get(group)
            best, roles = max(group, key=lambda g: self.value(g[0]))
            if self.better(best, inc, roles):
                self.notes.append(f"one knob at a time: {roles[keys.KNOB_STEP]} beat the best so far "
                                  f"({self.value(best):.1f} vs {self.value(inc):.1f} samples/s)")
                inc = best
        self.incumbent = inc
        return inc

