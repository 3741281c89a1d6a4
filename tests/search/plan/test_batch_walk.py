"""The batch-size walk as a pure function: what it queues for given measurements, with no study at all."""

from __future__ import annotations

from autotune.search.plan.batch_walk import next_steps
from autotune.machine.hardware import detect
from autotune.search.space.search_space import space_from_dict

SPACE = space_from_dict({"name": "walk", "device": "cpu",
                         "parameters": {"batch_size": {"type": "int", "choices": [8, 16, 32, 64]},
                                        "channels_last": {"type": "bool"}},
                         "baseline": {"batch_size": 8, "channels_last": False}}, hardware=detect(with_torch=False))
ANCHOR = {"batch_size": 16, "channels_last": True}


def key(bs: int) -> tuple:
    return SPACE.effective({"batch_size": bs, "channels_last": True}).key()


def walk(measured: dict[int, float], present=()) -> list[tuple[int, int]]:
    steps = next_steps(ANCHOR, SPACE, {key(b): v for b, v in measured.items()},
                       {key(b) for b in [*measured, *present]})
    return [(s.params["batch_size"], s.direction) for s in steps]


def test_nothing_before_the_anchor_is_measured():
    assert walk({}) == [] and walk({32: 50.0}) == []


def test_one_step_each_way_from_a_measured_anchor():
    assert walk({16: 10.0}) == [(8, -1), (32, 1)]


def test_a_direction_goes_on_while_each_step_wins_and_ends_when_one_loses():
    assert walk({16: 10.0, 8: 5.0, 32: 20.0}) == [(64, 1)]
    assert walk({16: 10.0, 8: 5.0, 32: 9.0}) == []
    assert walk({16: 10.0, 8: 5.0, 32: 0.0}) == []  # out of memory, failed or pruned: measured as 0


def test_a_step_already_queued_or_running_is_not_queued_again():
    assert walk({16: 10.0}, present=[8, 32]) == []


def test_a_step_says_why():
    (step,) = next_steps(ANCHOR, SPACE, {key(16): 10.0, key(8): 5.0}, {key(16), key(8)})
    assert step.why() == "batch 16 (10.0 samples/s) beat the step before: batch 32 is queued next"
