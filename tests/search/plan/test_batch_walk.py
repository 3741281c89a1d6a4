"""The batch-size walk as a pure function: what it queues for given measurements, with no study at all."""

from __future__ import annotations

from autotune.search.plan.batch_walk import next_steps, walked
from autotune.machine.hardware import detect
from autotune.search.space.search_space import space_from_dict

SPACE = space_from_dict({"name": "walk", "device": "cpu",
                         "parameters": {"batch_size": {"type": "int", "choices": [8, 16, 32, 64]},
                                        "channels_last": {"type": "bool"}},
                         "baseline": {"batch_size": 8, "channels_last": False}}, hardware=detect(with_torch=False))
ANCHOR = {"batch_size": 16, "channels_last": True}


def key(bs: int) -> tuple:
    return SPACE.effective({"batch_size": bs, "channels_last": True}).key()


def walk(measured: dict[int, float], present=(), noise: float = 0.0) -> list[tuple[int, int]]:
    steps = next_steps(ANCHOR, SPACE, {key(b): v for b, v in measured.items()},
                       {key(b) for b in [*measured, *present]}, noise=noise)
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


def test_a_step_within_the_noise_of_the_best_looks_one_step_further_once():
    """Issue 50: batch 128 measured just under 64 once (noise) and ended a walk that went on to 256 at x1.8 in a
    longer run. Within the noise (5%) of the best on the line, the walk measures one step more; a second step in a
    row that does not beat the best ends it, as does one beyond the noise below it, or a failed one."""
    assert walk({16: 10.0, 8: 5.0, 32: 9.8}, noise=0.05) == [(64, 1)]
    (step,) = next_steps(ANCHOR, SPACE, {key(16): 10.0, key(8): 5.0, key(32): 9.8}, {key(16), key(8), key(32)},
                         noise=0.05)
    assert step.why() == ("batch 32 (9.8 samples/s) came within the noise of batch 16 (10.0): batch 64 is measured "
                          "before the walk ends this way")
    assert walk({16: 10.0, 8: 5.0, 32: 9.8, 64: 9.9}, noise=0.05) == []  # two in a row without a new best
    assert walk({16: 10.0, 8: 5.0, 32: 9.0}, noise=0.05) == []  # 10% under: beyond the noise
    assert walk({16: 10.0, 8: 5.0, 32: 0.0}, noise=0.05) == []
    assert walk({16: 10.0, 8: 9.7}, noise=0.05) == [(32, 1)]  # within the noise down, but 8 is the end
    over, line = walked(ANCHOR, SPACE, {key(16): 10.0, key(8): 5.0, key(32): 9.8, key(64): 12.0}, noise=0.05)
    assert over and [p["batch_size"] for p in line] == [16, 8, 32, 64]  # the look found the better batch
    over, line = walked(ANCHOR, SPACE, {key(16): 10.0, key(8): 5.0, key(32): 9.8}, noise=0.05)
    assert not over  # 64 still to measure
    assert walked(ANCHOR, SPACE, {key(16): 10.0, key(8): 5.0, key(32): 9.8})[0]  # without a noise: over at 32
