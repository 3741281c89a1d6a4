"""The finalists' rounds: what they measured (``Evidence``, ``remeasure``), kept in the study as they are
measured, so a run killed during the finalists resumes them instead of losing them all; and their numerics checks
(``record_parity``), kept where `show` finds them.

Each finalist run's result is stored (``trials.FINALIST_ROUNDS``: the measurement's digest and every run's result,
by round and config) the moment it returns. A later ``finalize`` measured the same way (windows, time limit) takes
from the store every round of its own plan that is *complete* there: each of its finalists has that round's run,
whatever else the earlier plan held. So a resumed run whose fresh budget plans other finalists or other rounds
(``--timeout``: the plan is priced from the time left) keeps the rounds the two plans share, and says which
(``SavedRounds.said``); before, any change of plan dropped them all while the resume line said they were kept. A
round stopped part-way, or lacking one of this plan's finalists, is measured again whole: a round's configs run back
to back, at one moment of the machine, and the ratio interval (``settle.ratio_interval``) resamples rounds on that
premise; the runs of a stopped round, hours before the resume, would be compared with runs of another moment. A
finished ``finalize`` empties the store, so a later run measures its finalists afresh.

What follows the rounds is kept the same way, under the same plan, each under a tag of its own (``kept``, ``keep``):
an extra round of two finalists in dispute (``settle.ExtraRounds``: whole pairs only, as rounds), a config's
numerics check (``checking``) and its worst-case run (``keeping``). So a run killed in any of them, or in the
confirmation after them, resumes without measuring again what finished (``search.plan.resume``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from autotune.search.record import trials as keys
from autotune.config import MeasureSpec, TrialConfig, TrialResult
from autotune.measure import round_level
from autotune.search.budget import RUN_MARGIN
from autotune.trial.latency import worst_of

if TYPE_CHECKING:
    from optuna import Study

    from autotune.trial.parity import ParityResult

__all__ = ["SavedRounds", "record_parity", "Evidence", "remeasure", "pool_search_round", "run_log", "run_line",
           "run_configs", "rounds_way", "turns_possible", "turns_fit", "loaders_fit", "turn_extra"]


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _each(kept: list[int], counts: list[int]) -> str:
    """How many finalists each kept round holds, as ``SavedRounds.said`` says it."""
    return (f"{counts[0]} finalist(s) each" if len(set(counts)) == 1
            else ", ".join(f"round {r + 1}: {n} finalist(s)" for r, n in zip(kept, counts)))


class SavedRounds:
    """The store of one plan's finalist runs, in ``study``'s user attributes (``study=None``: kept nowhere).

    >>> saved = SavedRounds(study, configs, rounds=2, measure=spec)   # doctest: +SKIP
    >>> saved.round(0)      # {config key: TrialResult} of round 0 if it was finished, else None
    """

    def __init__(self, study: Study | None, configs: list[TrialConfig], *, rounds: int, measure: MeasureSpec,
                 by_turns: bool = False) -> None:
        self.study = study
        self.configs, self.rounds = list(configs), rounds
        # not the cap: by default a share of the memory free at start, so it moves between runs; ``choose``
        # judges every stored peak against the cap of the run that resumes anyway. Not the finalists nor the
        # rounds either: a run is kept by its round and config, and a round counts only where it is complete
        how = {k: v for k, v in measure.to_dict().items() if k != "memory_cap_mb"}
        # and how a round runs (by turns or one after the other): a round measured one way is not kept for the other
        self.plan = _digest({"measure": how, **({"by_turns": True} if by_turns else {})})
        stored = (study.user_attrs.get(keys.FINALIST_ROUNDS) if study is not None else None) or {}
        self.runs: dict[str, dict] = dict(stored.get("runs") or {}) if stored.get("plan") == self.plan else {}

    def said(self) -> str | None:
        """What this plan takes from an interrupted run's store, in one line (None when it holds no round's run):
        the complete rounds kept, and the stored runs measured again (their round lacks one of this plan's
        finalists, or was cut short) or not used (not this plan's finalists or rounds)."""
        mine = {_digest(c.to_dict()) for c in self.configs}
        stored = [(int(tag), d) for tag, d in (k.split(":", 1) for k in self.runs) if tag.isdigit()]
        if not stored:
            return None  # only later phases' runs (extra rounds, checks): their own lines say what is kept
        kept, counts = self._kept_rounds()
        again = sum(1 for r, d in stored if r < self.rounds and r not in kept and d in mine)
        unused = sum(1 for r, d in stored if d not in mine or r >= self.rounds)
        line = (f"  from the interrupted run: round(s) {', '.join(str(r + 1) for r in kept)} of {self.rounds} kept "
                f"whole ({_each(kept, counts)})" if kept else
                f"  from the interrupted run: none of the {self.rounds} round(s) of these {len(self.configs)} "
                "finalist(s) kept")
        if again:
            line += f"; {again} of its run(s) measured again (a round is kept whole or not at all)"
        if unused:
            line += f"; {unused} of its run(s) not used (not this plan's finalists or rounds)"
        return line

    @staticmethod
    def _key(tag: int | str, config: TrialConfig) -> str:
        return f"{tag}:{_digest(config.to_dict())}"

    def round(self, r: int) -> dict[tuple, TrialResult] | None:
        """Round ``r``'s results by config key, when every finalist's run of it is stored; else None."""
        return self.kept(r, self.configs)

    def kept(self, tag: int | str, configs: list[TrialConfig]) -> dict[tuple, TrialResult] | None:
        """The runs stored under ``tag`` (a round's number, ``extra-1``...) of every one of ``configs``, by config
        key; None unless all are (a part of a round is measured again whole)."""
        found = [self.runs.get(self._key(tag, c)) for c in configs]
        if any(x is None for x in found):
            return None
        return {c.key(): TrialResult.from_dict(x) for c, x in zip(configs, found)}

    def _kept_rounds(self) -> tuple[list[int], list[int]]:
        """The rounds stored whole, each of every finalist still in it (``narrowed``), and how many each holds."""
        kept, counts, active = [], [], list(self.configs)
        for r in range(self.rounds):
            active = self.narrowed(r, active) or active
            if self.kept(r, active) is None:
                break
            kept.append(r)
            counts.append(len(active))
        return kept, counts

    def narrow(self, r: int, of: list[TrialConfig], configs: list[TrialConfig]) -> None:
        """Round ``r`` runs ``configs`` only, of the finalists still in, ``of`` (``remeasure``: a round of all did
        not fit)."""
        self._store(f"fewer-{r}:configs", {"of": sorted(_digest(c.to_dict()) for c in of),
                                           "ran": sorted(_digest(c.to_dict()) for c in configs)})

    def narrowed(self, r: int, of: list[TrialConfig]) -> list[TrialConfig] | None:
        """Those of ``of`` (the finalists still in) that an interrupted run of this plan ran round ``r`` with, where
        it ran it with fewer of the same finalists (``narrow``); else None."""
        got = self.runs.get(f"fewer-{r}:configs")
        if not isinstance(got, dict) or got.get("of") != sorted(_digest(c.to_dict()) for c in of):
            return None
        return [c for c in of if _digest(c.to_dict()) in got.get("ran", ())] or None

    def put(self, r: int | str, config: TrialConfig, result: TrialResult) -> TrialResult:
        """Store one run's result now (its traceback stays in its log: the study keeps the figures); returns it."""
        d = result.to_dict()
        d["traceback"] = None
        self._store(self._key(r, config), d)
        return result

    def _store(self, key: str, value: dict) -> None:
        if self.study is not None:  # else nowhere to keep it
            self.runs[key] = value
            self.study.set_user_attr(keys.FINALIST_ROUNDS, {"plan": self.plan, "runs": self.runs})

    def keeping(self, tag: str, runner: Callable[..., TrialResult]) -> Callable[..., TrialResult]:
        """``runner`` whose result for a config is stored under ``tag`` as it returns, and taken from the store
        when an interrupted run of this plan stored it (a check's child: the worst-case batch)."""
        def run(workload: Any, config: TrialConfig, measure: MeasureSpec, **kw: Any) -> TrialResult:
            stored = self.runs.get(self._key(tag, config))
            if stored is not None:
                return TrialResult.from_dict(stored)
            return self.put(tag, config, runner(workload, config, measure, **kw))

        return run

    def checking(self, check: Callable[..., ParityResult] | None) -> Callable[..., ParityResult]:
        """The numerics check ``check`` (None: ``parity.parity_check``) keeping each config's result (by its
        steps) as ``keeping`` keeps a run's."""
        def run(workload: Any, config: TrialConfig, **kw: Any) -> ParityResult:
            from autotune.trial.parity import ParityResult, parity_check

            key = self._key(f"numerics-{kw.get('steps')}", config)
            if key in self.runs:
                return ParityResult.from_dict(self.runs[key])
            result = (check or parity_check)(workload, config, **kw)
            self._store(key, result.to_dict())
            return result

        return run

    def clear(self) -> None:
        """The finalists are done: a later run measures its own."""
        self.runs = {}
        if self.study is not None and self.study.user_attrs.get(keys.FINALIST_ROUNDS) is not None:
            self.study.set_user_attr(keys.FINALIST_ROUNDS, None)


def record_parity(study: Study, trial_number: int, result: ParityResult) -> None:
    """Keep a finalist's numerics check in the study (its trial is finished, so the study holds it), where
    `show` and the report find it."""
    checks = dict(study.user_attrs.get(keys.PARITY) or {})
    checks[str(trial_number)] = result.to_dict()
    study.set_user_attr(keys.PARITY, checks)


def pool_search_round(ev: "Evidence", configs: list[TrialConfig], trials: list) -> bool:
    """With only one finalist round, count each finalist's search trial (the same config, measured earlier)
    as a round before it, so the choice rests on two measurements of each and ``ratio_interval`` has two
    rounds to resample. A second-best stand-in: the search round is not interleaved, and it is the round
    that put these configs among the finalists (its luck favours them), hence only when no second
    finalist round fits. Returns whether it pooled (every finalist that finished its round has its search
    windows)."""
    done = [(c, t) for c, t in zip(configs, trials) if len(ev.rounds[c.key()]) == 1]
    if len(done) < 2 or not all(t.user_attrs.get(keys.SAMPLES) for _, t in done):
        return False
    for c, t in done:
        ev.rounds[c.key()].insert(0, [float(x) for x in t.user_attrs[keys.SAMPLES]])
    ev.pooled = True
    return True


# --- the re-measurement -------------------------------------------------------------------------------

@dataclass
class Evidence:
    """What the finalists' rounds measured, per config key: the windows of each round it finished ok, its peak
    host and device memory over them, and why it is out: each round it did not finish ok ("round 2:
    over_memory (...)"), too little memory left under the margin, or a failed numerics check."""

    rounds: dict[tuple, list[list[float]]]
    peaks: dict[tuple, float]
    failures: dict[tuple, list[str]]
    device_peaks: dict[tuple, float | None]
    rounds_run: int = 0  # the interleaved finalist rounds that ran
    pooled: bool = False  # each finalist's search trial counts as a round (``pool_search_round``)
    compile_s: dict[tuple, list[float]] = dataclasses.field(default_factory=dict)  # measured, per round run ok
    # the most the tensors held on the device (the reserved peak, ``device_peaks``, counts the allocator's cache)
    device_allocated: dict[tuple, float] = dataclasses.field(default_factory=dict)
    # inference: each percentile of the step latency, its worst over the rounds (``trial.latency.worst_of``)
    latency: dict[tuple, dict] = dataclasses.field(default_factory=dict)

    walls: dict[tuple, list[float]] = dataclasses.field(default_factory=dict)  # each run's wall time, s
    # left out of the later rounds, with why (``remeasure``: a round of all did not fit); out unless no config
    # measured in every round qualifies (``finalists._qualified``); their rounds are a prefix of the others'
    left_out: dict[tuple, str] = dataclasses.field(default_factory=dict)

    def why_out(self, key: tuple) -> str:
        """Why the config of ``key`` is out, in one line: each failed round and check, or its leaving out."""
        return "; ".join(self.failures[key] + ([self.left_out[key]] if key in self.left_out else []))

    def samples(self, key: tuple) -> list[float]:
        return [x for r in self.rounds[key] for x in r]

    def add(self, r: int, c: TrialConfig, res) -> None:
        """Round ``r``'s run of ``c``: its windows, peaks, compile time and latency, or why it failed. The windows
        go to ``rounds[key][r]``, a round ``c`` has no windows of before it left empty (``settle.round_ratios`` pairs
        rounds by position: an extra round of two configs, one of them left out of a round, pairs round for round)."""
        k = c.key()
        self.walls.setdefault(k, []).append(res.wall_s or 0.0)
        if not res.ok:
            self.failures[k].append(f"round {r + 1}: {res.status}" + (f" ({res.reason})" if res.reason else ""))
            return
        self.rounds[k].extend([] for _ in range(r - len(self.rounds[k])))
        self.rounds[k].append(list(res.samples_per_s))
        self.peaks[k] = max(self.peaks[k], res.peak_host_mb or 0.0)
        if res.peak_device_mb is not None:
            self.device_peaks[k] = max(self.device_peaks[k] or 0.0, res.peak_device_mb)
        if res.peak_device_allocated_mb is not None:
            self.device_allocated[k] = max(self.device_allocated.get(k, 0.0), res.peak_device_allocated_mb)
        if res.compile_s is not None:
            self.compile_s.setdefault(k, []).append(res.compile_s)
        if res.latency_p99_ms is not None:
            self.latency[k] = worst_of(self.latency.get(k), res)


def run_log(log_dir: Any, tag: str, config: TrialConfig) -> Any:
    """The log file of one finalist-stage child run of ``config`` in ``log_dir``: ``<tag>-<config digest>.log``."""
    return log_dir / f"{tag}-{abs(hash(config.key())) % 10**6}.log"


def run_line(label: str, config: TrialConfig, res: TrialResult) -> str:
    """One run's line in the log: ``  <label> <config> <status> <samples/s or why>``."""
    return (f"  {label} {config.short():<40} {res.status:<8} "
            + (f"{res.median_samples_per_s:.1f} samples/s" if res.ok else res.reason))


def run_configs(configs: list[TrialConfig], logs: list[Any], *, runner, workload, measure: MeasureSpec,
                by_turns: bool = False, each: Callable[[TrialConfig, TrialResult], Any] | None = None
                ) -> list[TrialResult]:
    """Each of ``configs`` run once by ``runner``, in this order, its child's log at ``logs[i]`` (None: none): by turns
    (``trial.lockstep``: all alive, in short turns, the machine's moments shared) where ``by_turns`` and there are
    two or more, else one after the other. ``each(config, result)`` as each result is in (by turns: as the round
    ends), so that a kill loses no run that finished."""
    kws = [{} if path is None else {"log_path": path} for path in logs]
    if by_turns and len(configs) > 1:
        from autotune.trial.lockstep import run_round

        out = run_round(configs, lambda i, gate: runner(workload, configs[i], measure, gate=gate, **kws[i]))
        for c, res in zip(configs, out):
            if each is not None:
                each(c, res)
        return out
    out = []
    for c, kw in zip(configs, kws):
        out.append(runner(workload, c, measure, **kw))
        if each is not None:
            each(c, out[-1])
    return out


def turns_possible(workload: Any) -> bool:
    """Whether ``workload``'s rounds can take turns here at all: on this machine's CPU, one process a trial (a GPU
    would hold every child's model at once; DDP ranks are process groups of their own), where a round by turns can
    run (``trial.lockstep.available``: a FIFO in the temp folder, signals to stop a process group)."""
    from autotune.trial.lockstep import available

    return workload.device == "cpu" and workload.nproc_per_node == 1 and available()


def turns_fit(trials: list, workload: Any, *, margin: float, available_mb: float | None = None,
              cap_mb: float | None = None, shm_free_bytes: float | None = None) -> bool:
    """Whether a round of ``trials``' configs may take turns on this machine (``run_configs``): where turns are
    possible at all (``turns_possible``), and their search trials' peak host memory, all alive at once, within
    ``available_mb`` (default: what the machine has available now) less ``margin``, and within the user's memory cap
    (``cap_mb``, a trial's: the most the user let autotune hold at once) less ``margin`` too, and their loaders'
    batches in flight within ``/dev/shm`` (``loaders_fit``)."""
    if len(trials) < 2 or not turns_possible(workload):
        return False
    peaks = [t.user_attrs.get(keys.PEAK) if t is not None else None for t in trials]
    if any(not p for p in peaks):
        return False
    if available_mb is None:
        import psutil

        available_mb = psutil.virtual_memory().available / 2**20
    if sum(peaks) > min(available_mb, cap_mb or math.inf) * (1 - margin):
        return False
    return loaders_fit(trials, margin=margin, shm_free_bytes=shm_free_bytes)


def turn_extra(trials: list) -> float:
    """The share of a run's measured time that each turn's untimed first step adds (``trial.windows``), the most over
    ``trials``: a step of ``s`` seconds (the trial's data wait and compute a step; else its batch over its rate) once
    every turn of ``ceil(TURN_S / s)`` timed steps.

    >>> from types import SimpleNamespace as T
    >>> turn_extra([T(value=640.0, user_attrs={"config": {"batch_size": 64}})])   # 0.1 s steps: 5 a turn, and one
    0.2
    >>> turn_extra([T(value=1.0, user_attrs={"data_wait_s_per_step": 0.05, "compute_s_per_step": 0.15})])  # 0.2 s
    0.3333333333333333
    >>> turn_extra([T(value=32.0, user_attrs={"config": {"batch_size": 64}})])    # 2 s steps: one a turn, and one
    1.0
    """
    from autotune.trial.windows import TURN_S

    shares = [0.0]
    for t in trials:
        if t is None:
            continue
        ua, rate = t.user_attrs, getattr(t, "value", None)
        step = (ua.get(keys.DATA_WAIT_S) or 0.0) + (ua.get(keys.COMPUTE_S) or 0.0)
        if not step > 0 and rate and (ua.get(keys.CONFIG) or {}).get("batch_size"):
            step = ua[keys.CONFIG]["batch_size"] / rate
        if step > 0:
            shares.append(1.0 / max(1, math.ceil(TURN_S / step - 1e-9)))
    return max(shares)


def loaders_fit(trials: list, *, margin: float, shm_free_bytes: float | None = None) -> bool:
    """Whether the DataLoaders of ``trials``' configs fit ``/dev/shm`` all at once (a child stopped between its turns
    keeps its workers' batches there: ``machine.loader_memory``'s rule is for one loader at a time); a loader whose
    batch size is unknown does not. Default: what ``/dev/shm`` has free now."""
    from autotune.machine.loader_memory import detect_limits, in_flight_bytes

    need = 0.0
    for t in trials:
        c = keys.config_of(t)
        if c is None:
            return False
        if c.num_workers:
            batch = t.user_attrs.get(keys.BATCH_BYTES)
            if not batch:
                return False
            need += in_flight_bytes(batch, c.num_workers, c.prefetch_factor)
    if not need:
        return True
    free = detect_limits().shm_free_bytes if shm_free_bytes is None else shm_free_bytes
    return free is not None and need <= free * (1 - margin)


def rounds_way(by_turns: bool) -> str:
    """How a round runs its configs, as the log and the record say it."""
    from autotune.trial.windows import TURN_S

    return f"alive at once, taking turns of {TURN_S:g} s" if by_turns else "one after the other"


def remeasure(configs: list[TrialConfig], rounds: int, *, runner, workload, measure: MeasureSpec, log_dir,
              log: Callable[[str], None], saved=None, deadline: float | None = None,
              by_turns: bool = False) -> Evidence:
    """Run every config once a round, rotating the order each round; each run is kept in ``saved`` (a
    ``finalist_rounds.SavedRounds``) as it returns, and a round an interrupted run finished is taken from it.
    With a ``deadline`` (``time.monotonic()``), a round starts only when the round before, ``RUN_MARGIN`` longer,
    took less than the time left (the plan's estimate is the search trials' walls; a loaded machine's rounds take
    longer). Where a round of all no longer fits, a round of the fastest so far may (``_fewer``: at least two, each
    run priced as the last round's share): they run it, and the others are out, each with why; else the rounds not
    run are said, and ``rounds_run`` counts those that ran. A round kept from an interrupted run is priced by its runs'
    walls. (2026-11-30: a round of four priced at 24 s took 27 s,
    and the second round of all four did not fit: the choice rested on one round, where three fitted two.)
    ``by_turns``: each round's children take turns (``run_configs``)."""
    ev = Evidence({c.key(): [] for c in configs}, {c.key(): 0.0 for c in configs}, {c.key(): [] for c in configs},
                  {c.key(): None for c in configs})
    ev.rounds_run = rounds
    saved = saved or SavedRounds(None, configs, rounds=rounds, measure=measure)
    log(f"re-measuring {len(configs)} finalist(s) x {rounds} interleaved round(s), "
        f"{measure.windows} windows of >= {measure.window_s:g} s each"
        + (f", each round's {len(configs)} fresh processes {rounds_way(True)}" if by_turns and len(configs) > 1
           else ""))
    said = saved.said()
    if said:
        log(said)
    last_s, active = 0.0, list(configs)
    for r in range(rounds):
        left = None if deadline is None else deadline - time.monotonic()
        fewer = saved.narrowed(r, active) if r > 0 else None
        if fewer is not None and saved.kept(r, fewer) is not None:
            log(f"  round {r + 1}/{rounds}: an interrupted run ran it with {len(fewer)} of the {len(active)} "
                "finalists still in, the fastest before it, as the time left then allowed")
        elif left is not None and r > 0 and last_s * RUN_MARGIN > left:
            fewer = _fewer(active, ev, round_s=last_s, left_s=left)
            all_s = (f"round {r + 1}/{rounds} of {'all' if len(active) == len(configs) else 'the'} {len(active)}"
                     f"{'' if len(active) == len(configs) else ' still in'} priced {_up(last_s * RUN_MARGIN)} s "
                     f"with the {RUN_MARGIN - 1:.0%} a run may run over, more than the {_down(left)} s left in the "
                     "budget")
            if not fewer:
                log(f"  round {r + 1}/{rounds} and after not run: the last took {last_s:.0f} s, priced "
                    f"{_up(last_s * RUN_MARGIN)} s with the {RUN_MARGIN - 1:.0%} a run may run over, more than the "
                    f"{_down(max(0.0, left))} s left in the budget")
                ev.rounds_run = r
                break
            log(f"  {all_s}: a round of the {len(fewer)} fastest so far, ~{last_s * len(fewer) / len(active):.0f} s")
            saved.narrow(r, active, fewer)
        else:
            fewer = None
        if fewer is not None:
            mine = {c.key() for c in fewer}
            for c in active:
                if c.key() not in mine and not ev.failures[c.key()]:
                    ev.left_out[c.key()] = _left_out(c, fewer, ev, r)
                    log(f"  {c.short()} {ev.left_out[c.key()]}")
            active = fewer
        started = time.monotonic()
        order = active[r % len(active):] + active[: r % len(active)]
        kept = saved.kept(r, active)
        if kept is not None:
            log(f"  round {r + 1}/{rounds}: measured by an earlier, interrupted run of these finalists; kept")
        got = ([kept[c.key()] for c in order] if kept is not None else
               run_configs(order, [run_log(log_dir, f"finalist-{r}", c) for c in order], runner=runner,
                           workload=workload, measure=measure, by_turns=by_turns,
                           each=lambda c, res: saved.put(r, c, res)))  # noqa: B023 - called within this round
        for c, res in zip(order, got):
            ev.add(r, c, res)
            log(run_line(f"round {r + 1}/{rounds}", c, res) + (" (kept)" if kept else ""))
        # a kept round took no time now: the next is priced by its runs' walls (by turns each ran the round through)
        walls = [res.wall_s or 0.0 for res in got]
        last_s = (time.monotonic() - started if kept is None else
                  max(walls) if by_turns and len(got) > 1 else sum(walls))
    return ev


def _up(x: float) -> str:
    """``x`` to one decimal, rounded up: a price printed beside ``_down``'s time left says what it compared."""
    return f"{math.ceil(x * 10) / 10:.1f}"


def _down(x: float) -> str:
    return f"{math.floor(x * 10) / 10:.1f}"


def _so_far(ev: Evidence, c: TrialConfig) -> float:
    """``c``'s speed over the rounds it has run: the geometric mean of its round medians (0 before any). Those still
    in have run the same rounds, so this ranks them as the choice's paired ratios do (``settle.paired_speeds``);
    pooled windows would rank by which round, on a machine that drifted, held more of a config's windows."""
    return round_level(ev.rounds[c.key()]) or 0.0


def _fewer(active: list[TrialConfig], ev: Evidence, *, round_s: float, left_s: float) -> list[TrialConfig]:
    """The most of ``active``'s fastest so far (``_so_far``), at least two and fewer than all, none that failed a
    round (it is out whatever it measured), whose round fits ``left_s``, each run priced as ``round_s`` over
    ``len(active)`` and ``RUN_MARGIN`` longer; in ``active``'s order. [] when not even two fit. Another round of the
    fastest is worth more than none: a choice on one round rests on one draw of each, and the slowest of a round is
    the least likely to be the fastest. (It may be the lighter one a tie would have chosen (``settle.lightest``):
    left out, it cannot be.)"""
    ranked = sorted((c for c in active if not ev.failures[c.key()]), key=lambda c: -_so_far(ev, c))
    for k in range(min(len(ranked), len(active) - 1), 1, -1):
        if round_s * k / len(active) * RUN_MARGIN <= left_s:
            keep = {c.key() for c in ranked[:k]}
            return [c for c in active if c.key() in keep]
    return []


def _left_out(c: TrialConfig, fewer: list[TrialConfig], ev: Evidence, r: int) -> str:
    """Why ``c`` is out: left out of round ``r + 1`` (``_fewer``), its figure so far against the fastest's."""
    top = max(_so_far(ev, x) for x in fewer)
    mine = _so_far(ev, c)
    behind = f", {100 * max(0.0, 1 - mine / top):.1f}% behind the fastest" if top > 0 and mine > 0 else ""
    return (f"left out of round {r + 1}: the time left fitted a round of the {len(fewer)} fastest only "
            f"({mine:.1f} samples/s over {r} round(s){behind})")
