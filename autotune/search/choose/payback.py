"""Does ``torch.compile`` pay back over the user's real run? The break-even arithmetic, pure.

A compiled config pays its compile time once, then runs at its steady-state throughput ``thr_c``; the best
eager config starts at once at ``thr_e``. Configs differ in batch size, so the arithmetic is in samples:
processing ``N`` samples takes ``compile_s + N / thr_c`` compiled and ``N / thr_e`` eager, equal at

    N* = compile_s / (1 / thr_e - 1 / thr_c)          (break-even samples; never when thr_c <= thr_e)

which is ``N* / batch_size`` steps of the compiled config and ``N* / thr_e`` seconds of eager training
(= ``compile_s + N* / thr_c``). How long the run is comes from the user (``RunLength``: ``--planned-steps N``
or ``--run-length 6h``; by default an assumed hour, ``DEFAULT_RUN_S``). Over that run a config is worth its
*effective* throughput, samples over wall time including its compile:

* a run of ``steps``: ``N = steps x batch_size`` samples (the config's own steps), ``N / (compile_s + N / thr)``;
* a run of ``seconds`` ``T``: ``thr x max(0, T - compile_s) / T`` (the compile eats the start of the run).

Both give the same verdict (the run is longer than the break-even), and an eager config's effective throughput
is its steady one. ``finalists.choose`` ranks the finalists by it: a compiled config that does not pay back
is not excluded, it is ranked on what it would deliver over the run, which is the honest comparison.

>>> be = break_even(100.0, 110.0, 90.0, batch_size=64)     # 10% faster once compiled, 90 s to compile
>>> round(be.samples), round(be.steps), round(be.seconds)
(99000, 1547, 990)
>>> round(effective_samples_per_s(110.0, 90.0, RunLength(steps=100), batch_size=64), 1)   # 6,400 samples
43.2
>>> round(effective_samples_per_s(110.0, 90.0, RunLength(seconds=3600), batch_size=64), 1)
107.2
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import ConfigError

__all__ = ["DEFAULT_RUN_S", "RunLength", "BreakEven", "break_even", "effective_samples_per_s", "Priced",
           "Pricing", "price"]

# The run assumed when the user states none: long enough that a compile of ~90 s must buy a 2.5% gain.
DEFAULT_RUN_S = 3600.0


@dataclass(frozen=True)
class RunLength:
    """How long the user's training runs: ``steps`` (each config's own steps) or ``seconds`` of wall time,
    exactly one; ``assumed`` when it is the default rather than the user's statement."""

    seconds: float | None = None
    steps: int | None = None
    assumed: bool = False

    def __post_init__(self) -> None:
        if (self.seconds is None) == (self.steps is None):
            raise ConfigError("a run length is either steps or seconds: give exactly one "
                              "(--planned-steps N or --run-length DURATION)")
        if self.seconds is not None and not (isinstance(self.seconds, (int, float)) and self.seconds > 0
                                             and math.isfinite(self.seconds)):
            raise ConfigError(f"run length {self.seconds!r} s: give a positive duration, e.g. 6h")
        if self.steps is not None and not (isinstance(self.steps, int) and not isinstance(self.steps, bool)
                                           and self.steps > 0):
            raise ConfigError(f"planned steps {self.steps!r}: give a whole number of steps >= 1")

    @classmethod
    def default(cls) -> "RunLength":
        return cls(seconds=DEFAULT_RUN_S, assumed=True)

    @classmethod
    def parse(cls, run_length: str | float | None = None, planned_steps: int | None = None, *,
              what: tuple[str, str] = ("run_length", "planned_steps"), require_unit: bool = False) -> "RunLength":
        """From ``run_length`` (a duration: "6h", "90m"; a bare number is seconds) or ``planned_steps``; neither
        is the default, both is an error naming ``what`` (the two options' names)."""
        from autotune._units import parse_duration_s

        if run_length is not None and planned_steps is not None:
            raise ConfigError(f"{what[0]} and {what[1]} both state the run's length: give one")
        if planned_steps is not None:
            if isinstance(planned_steps, bool) or not isinstance(planned_steps, int) or planned_steps < 1:
                raise ConfigError(f"{what[1]} {planned_steps!r}: give a whole number of steps >= 1")
            return cls(steps=planned_steps)
        if run_length is not None:
            return cls(seconds=parse_duration_s(run_length, what=what[0], require_unit=require_unit))
        return cls.default()

    def label(self) -> str:
        """``"100 steps"``, ``"6h"``, ``"1h (assumed: no --run-length or --planned-steps given)"``."""
        if self.steps is not None:
            return f"{self.steps:,} steps"
        s = self.seconds or 0.0
        text = f"{s / 3600:g}h" if s >= 3600 else f"{s / 60:g}m" if s >= 60 else f"{s:g}s"
        return text + (" (assumed: no --run-length or --planned-steps given)" if self.assumed else "")

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "steps": self.steps, "assumed": self.assumed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunLength":
        return cls(seconds=d.get("seconds"), steps=d.get("steps"), assumed=bool(d.get("assumed")))


@dataclass(frozen=True)
class BreakEven:
    """Where a compiled config catches up with eager: samples, its own steps, and seconds of eager training;
    all ``math.inf`` when it is not faster steady-state (it never catches up)."""

    samples: float
    steps: float
    seconds: float

    def to_dict(self) -> dict[str, float | None]:
        return {k: None if math.isinf(v) else round(v, 1)
                for k, v in (("samples", self.samples), ("steps", self.steps), ("seconds", self.seconds))}


def break_even(eager_samples_per_s: float, compiled_samples_per_s: float, compile_s: float, *,
               batch_size: int) -> BreakEven:
    """``N* = compile_s / (1/thr_e - 1/thr_c)`` samples (module docstring).

    >>> break_even(100.0, 100.0, 90.0, batch_size=64).samples    # not faster: never
    inf
    >>> break_even(100.0, 200.0, 0.0, batch_size=64).samples     # nothing to pay back
    0.0
    """
    gain_s_per_sample = 1.0 / eager_samples_per_s - 1.0 / compiled_samples_per_s
    if gain_s_per_sample <= 0:
        return BreakEven(math.inf, math.inf, math.inf)
    n = compile_s / gain_s_per_sample
    return BreakEven(n, n / batch_size, n / eager_samples_per_s)


def effective_samples_per_s(samples_per_s: float, compile_s: float | None, run: RunLength, *,
                            batch_size: int) -> float:
    """Samples per second of wall time over ``run``, the compile included (module docstring); an eager config
    (``compile_s`` None or 0) keeps its steady throughput.

    >>> effective_samples_per_s(100.0, 200.0, RunLength(seconds=100), batch_size=8)   # compiling the whole run
    0.0
    """
    if not compile_s:
        return samples_per_s
    if run.steps is not None:
        n = run.steps * batch_size
        return n / (compile_s + n / samples_per_s)
    t = run.seconds or 0.0
    return samples_per_s * max(0.0, t - compile_s) / t


@dataclass(frozen=True)
class Priced:
    """One finalist to price: its key, label, steady-state median, batch size, and (compiled configs only) its
    compile time: cold (the first compile of its graph in the study: what a fresh run pays) and cached (from
    the study's inductor cache, when a later trial hit it)."""

    key: Any
    short: str
    samples_per_s: float
    batch_size: int
    compile_s: float | None = None
    compile_s_cached: float | None = None


@dataclass
class Pricing:
    """``factor``: effective over steady throughput per key (1 for eager configs); ``record``: what the YAML's
    ``compile`` section holds; ``dropped``: the fastest config steady-state compiles and does not pay back."""

    factor: dict[Any, float]
    record: dict[str, Any]
    dropped: Priced | None = None
    notes: list[str] = field(default_factory=list)


def price(finalists: list[Priced], run: RunLength) -> Pricing:
    """Each finalist's effective throughput over ``run`` and each compiled one's break-even against the
    fastest eager finalist (none when no eager finalist finished)."""
    factor = {p.key: effective_samples_per_s(p.samples_per_s, p.compile_s, run, batch_size=p.batch_size)
              / p.samples_per_s for p in finalists}
    eager = max((p for p in finalists if p.compile_s is None), key=lambda p: p.samples_per_s, default=None)
    rows, pays = [], {}
    for p in finalists:
        if p.compile_s is None:
            continue
        row: dict[str, Any] = {"config": p.short, "compile_s": round(p.compile_s, 2),
                               "compile_s_cached": None if p.compile_s_cached is None else round(p.compile_s_cached, 2),
                               "samples_per_s": round(p.samples_per_s, 3),
                               "effective_samples_per_s": round(p.samples_per_s * factor[p.key], 3)}
        if not p.compile_s:
            row["note"] = "compile time not measured (a trial from before it was): priced as free"
        if eager is not None:
            be = break_even(eager.samples_per_s, p.samples_per_s, p.compile_s, batch_size=p.batch_size)
            pays[p.key] = p.samples_per_s * factor[p.key] > eager.samples_per_s
            row.update(break_even=be.to_dict(), pays_back=pays[p.key])
        rows.append(row)
    record = {"planned_run": run.to_dict(), "planned_run_label": run.label(),
              "against": None if eager is None else {"config": eager.short,
                                                      "samples_per_s": round(eager.samples_per_s, 3)},
              "configs": rows}
    top = max(finalists, key=lambda p: p.samples_per_s, default=None)
    dropped = top if top is not None and pays.get(top.key) is False else None
    record["dropped"] = dropped is not None
    notes = []
    if dropped is not None and eager is not None:
        be = break_even(eager.samples_per_s, dropped.samples_per_s, dropped.compile_s or 0.0,
                        batch_size=dropped.batch_size)
        notes.append(f"{dropped.short} is {100 * (dropped.samples_per_s / eager.samples_per_s - 1):.1f}% faster "
                     f"than {eager.short} once compiled, but its {dropped.compile_s:.0f} s compile does not pay back "
                     f"over the planned run ({run.label()}): break-even after {be.samples:,.0f} samples "
                     f"({be.steps:,.0f} steps, {be.seconds / 60:,.1f} min); --run-length or --planned-steps "
                     "states the real run")
    return Pricing(factor, record, dropped, notes)
