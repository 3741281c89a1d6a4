"""What the trial child tells its parent: one typed schema, encoded by the child (``worker``) and decoded by the
parent (``runner``), one JSON line per event on the event pipe.

In order: ``Started``, ``Ranks`` (a trial of several DDP ranks, ``trial.ddp``), ``Built``, ``Warmup``, one
``Window`` per measured window (each after a ``Turn`` where the round measures by turns, ``trial.lockstep``),
``Profiled`` (with a profile folder), then ``Done`` or ``Failed``. Both sides
build and read these classes, never the raw dict, so a field renamed or added on one side fails loudly: the child
cannot build an event with a field the class does not have, the parent cannot read one it lacks, and a line whose
fields are not the class's (a child of another version) is an ``EventError``, not a silently missing figure. A
line that is not JSON at all (a write cut short by a kill) is no event and is skipped by the parent.

``run_trial(on_event=...)`` hands each event on as ``to_dict(event)``, the line's own dict.

>>> decode(encode(Window(index=0, samples_per_s=120.5, steps=3, data_wait_s=0.001, compute_s=0.02)))
Window(index=0, samples_per_s=120.5, steps=3, data_wait_s=0.001, compute_s=0.02, tokens_per_s=None)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

__all__ = ["Started", "Ranks", "Built", "Warmup", "Window", "Turn", "Profiled", "Done", "Failed", "Event", "EVENTS",
           "EventError", "encode", "decode", "to_dict", "from_dict"]

# a field left out of the line while it holds its default (None): as the child sent it before the schema
_OMIT_NONE = {"omit_none": True}


class EventError(ValueError):
    """A line on the event pipe that is JSON but no event of this schema: the child and the parent disagree (a
    bug, or a child of another autotune version), so the trial cannot be read."""


@dataclass(frozen=True, kw_only=True)
class _Event:
    NAME: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # JSON has lists; the events hold tuples, so a round trip is equal
            if isinstance(getattr(self, f.name), list):
                object.__setattr__(self, f.name, tuple(getattr(self, f.name)))


@dataclass(frozen=True, kw_only=True)
class Started(_Event):
    """The child runs (before torch is imported)."""

    NAME: ClassVar[str] = "started"
    pid: int


@dataclass(frozen=True, kw_only=True)
class Ranks(_Event):
    """The trial child started its DDP ranks (``trial.ddp.supervise``): how many, and their pids."""

    NAME: ClassVar[str] = "ranks"
    world_size: int
    pids: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Built(_Event):
    """The workload is built and on the device: seconds since the parent spawned the child, the loader's steps per
    epoch, micro-batches per optimizer step (a global batch), the workload's own parts, the device memory cap the
    allocator enforces (None on the CPU)."""

    NAME: ClassVar[str] = "built"
    startup_s: float
    steps_per_epoch: int
    accumulation_steps: int = 1
    user_parts: tuple[str, ...] = ()
    device_memory_cap_mb: float | None = None
    world_size: int = 1  # DDP ranks in the trial (``trial.ddp``): rank 0's event, relayed
    # a worst-case run (``MeasureSpec.worst_case``): which batch, said before it runs (a kill still names it)
    worst_case: dict[str, Any] | None = field(default=None, metadata=_OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Warmup(_Event):
    """The warm-up ended where the first measured window began (``worker._WarmUp.event``)."""

    NAME: ClassVar[str] = "warmup"
    warmup_s: float
    warmup_steps: int
    compile_s: float | None
    step_s: float
    first_step_s: float
    warmup_windows: tuple[float, ...] = ()  # windows re-labelled warm-up: their rates
    settled: bool | None = None  # later windows confirmed it (None: not checked)
    # the first batch as a DataLoader worker hands it over: its tensors' bytes and how many (trial.loader_watch)
    batch_bytes: int | None = field(default=None, metadata=_OMIT_NONE)
    batch_tensors: int | None = field(default=None, metadata=_OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Window(_Event):
    """One measured window: its rate, its optimizer steps and their split between waiting for data and computing."""

    NAME: ClassVar[str] = "window"
    index: int
    samples_per_s: float
    steps: int
    data_wait_s: float
    compute_s: float
    tokens_per_s: float | None = field(default=None, metadata=_OMIT_NONE)  # where the workload counts tokens
    # with DDP ranks: each rank's rate over the window (``samples_per_s`` is all ranks' samples over the slowest's time)
    rank_samples_per_s: tuple[float, ...] | None = field(default=None, metadata=_OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Turn(_Event):
    """The child is at its gate, waiting for its next turn (a round measured by turns, ``trial.lockstep``: turns of
    ``trial.windows.TURN_S``, between two steps); ``index``: the turns it had before this one."""

    NAME: ClassVar[str] = "turn"
    index: int


@dataclass(frozen=True, kw_only=True)
class Profiled(_Event):
    """The profiler's run after the windows wrote a Chrome trace and its top operators (``trial.profile``)."""

    NAME: ClassVar[str] = "profiled"
    trace: str
    top_ops: str
    steps: int


@dataclass(frozen=True, kw_only=True)
class Done(_Event):
    """The trial measured: the figures over its windows that only the child can see."""

    NAME: ClassVar[str] = "done"
    kernel_cpu_share: float | None
    minor_faults_per_step: float
    final_loss: float | None
    data_wait_s_per_step: float
    compute_s_per_step: float
    peak_device_mb: float | None
    peak_device_allocated_mb: float | None = None
    samples_per_step: float
    cpu_cores_used: float | None = field(default=None, metadata=_OMIT_NONE)  # the process tree's CPU / wall
    profile: dict[str, Any] | None = field(default=None, metadata=_OMIT_NONE)  # ``Profiled``'s fields
    world_size: int = 1
    ranks: tuple[dict[str, Any], ...] = ()  # with DDP ranks: each rank's figures (``trial.ranks.RankGroup.per_rank``)
    # inference: the measured steps' latency percentiles (``trial.latency.percentiles``)
    latency: dict[str, Any] | None = field(default=None, metadata=_OMIT_NONE)


@dataclass(frozen=True, kw_only=True)
class Failed(_Event):
    """The trial raised: ``kind`` "oom", "workload" (the user's workload is wrong), "crashed" (a DDP rank died
    without a word, ``trial.ddp``) or "error"; the one-line message
    and the end of the traceback."""

    NAME: ClassVar[str] = "failed"
    kind: str
    message: str
    traceback: str


Event = Union[Started, Ranks, Built, Warmup, Window, Turn, Profiled, Done, Failed]
EVENTS: dict[str, type[_Event]] = {cls.NAME: cls for cls in (Started, Ranks, Built, Warmup, Window, Turn, Profiled,
                                                              Done, Failed)}


def to_dict(event: Event) -> dict[str, Any]:
    """``{"event": NAME, **fields}``: what the line says."""
    out: dict[str, Any] = {"event": event.NAME}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if not (value is None and f.metadata.get("omit_none")):
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def from_dict(d: dict[str, Any]) -> Event:
    """The event a line's dict says; ``EventError`` when it names no event or its fields are not that event's."""
    d = dict(d)
    name = d.pop("event", None)
    cls = EVENTS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise EventError(f"unknown trial event {name!r} (known: {', '.join(EVENTS)}): the trial child and its parent "
                         "disagree on autotune.trial.events")
    names = {f.name for f in dataclasses.fields(cls)}
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    unknown, missing = sorted(set(d) - names), sorted(required - set(d))
    if unknown or missing:
        raise EventError(f"trial event {name!r}" + (f" has unknown fields {unknown}" if unknown else "")
                         + (" and" if unknown and missing else "") + (f" lacks {missing}" if missing else "")
                         + ": the trial child and its parent disagree on autotune.trial.events")
    return cls(**d)  # type: ignore[return-value]


def encode(event: Event) -> bytes:
    """One line of the event pipe."""
    return json.dumps(to_dict(event)).encode() + b"\n"


def decode(line: bytes | str) -> Event:
    """The event one line says. ``ValueError`` (``json.JSONDecodeError``) when it is not JSON; ``EventError`` when
    it is JSON but no event of this schema."""
    d = json.loads(line)
    if not isinstance(d, dict):
        raise EventError(f"a trial event is a JSON object, not {type(d).__name__}: {str(line)[:200]}")
    return from_dict(d)
