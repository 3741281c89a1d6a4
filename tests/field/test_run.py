"""``FieldRun`` on real torch loops in this process: steps from torch's optimizer step hook, samples from the
batches ``prepare_input`` sees, the data wait, inference, and failures that turn it off without touching the loop."""

from __future__ import annotations

import time

import pytest
import torch

from autotune.config import TrialConfig, Workload
from autotune.field import Claim, FieldRun, FieldSpec
from tests.helpers import make_rec

SPEC = FieldSpec(window_s=0.05, host_every_s=0.02, keep_every_s=0.05)


def _loop(run, steps: int, *, wait_s: float = 0.0, batch: int = 8, optimizer=None, model=None):
    model = model or torch.nn.Linear(16, 4)
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=0.01)
    ends = []  # the loop's own clock at each step's end: the independent timer
    for _ in range(steps):
        time.sleep(wait_s)  # the loader
        x, y = run.prepare_input(torch.randn(batch, 16)), run.prepare_input(torch.randint(0, 4, (batch,)))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        ends.append(time.perf_counter())
        optimizer.zero_grad()
    return ends


class _Seen:
    """A loop's ``prepare_input`` that only hands the batch to a field run (or to none)."""

    def __init__(self, run) -> None:
        self.run = run

    def prepare_input(self, x):
        if self.run is not None:
            self.run.batch(x)
        return x


def test_steps_samples_and_the_data_wait_come_from_the_step_hook_and_prepare_input():
    lines, kept = [], []
    rec = make_rec(config=TrialConfig(batch_size=8), storage="")
    run = FieldRun(rec.field_claim(), spec=SPEC, sink=kept.append, log=lines.append)
    with rec.apply(field=False) as applied:
        applied._field = run.start()
        ends = _loop(applied, 60, wait_s=0.01, batch=6)
        run.stop()
    assert run.steps == 60 and run.off is None
    ws = run.train.closed
    assert sum(w.steps for w in ws) <= 59 and sum(w.samples for w in ws) == 6 * sum(w.steps for w in ws)
    for w in ws:  # each step waited 10 ms (and a little more: the sleep's own lateness) for its batch
        assert 0.01 <= w.wait_s / w.steps <= 0.03, w
    # the windows against the loop's own timer over the same steps (the first step is warm-up: not in a window)
    n = sum(w.steps for w in ws)
    assert sum(w.samples for w in ws) / sum(w.seconds for w in ws) == pytest.approx(6 * n / (ends[n] - ends[0]),
                                                                                    rel=0.02)
    assert kept and kept[-1]["steps"] == 60 and kept[-1]["state"] == "ended" and lines[-1] == kept[-1]["line"]


def test_accumulation_counts_the_micro_batches_of_a_step():
    rec = make_rec(config=TrialConfig(batch_size=4), storage="")
    run = FieldRun(rec.field_claim(), spec=SPEC, log=lambda s: None, accumulation=3)
    with rec.apply(field=False) as applied:
        applied._field = run.start()
        _loop(applied, 20, batch=4, wait_s=0.005)
        run.stop()
    assert run.train.closed and all(w.samples == 12 * w.steps for w in run.train.closed)


def test_inference_batches_are_windows_of_their_own_and_evaluation_is_the_loops_own_work():
    rec = make_rec(config=TrialConfig(batch_size=8), storage="", workload=Workload(model="resnet18", task="infer"))
    run = FieldRun(rec.field_claim(), spec=SPEC, log=lambda s: None)
    model = torch.nn.Linear(16, 4)
    with rec.apply(field=False) as applied:
        applied._field = run.start()
        with torch.inference_mode():
            for _ in range(150):
                model(applied.prepare_input(torch.randn(8, 16)))
                applied.prepare_input(torch.randint(0, 4, (8,)))  # the targets: not a step of their own
                time.sleep(0.003)
        run.stop()
    assert run.steps == 0 and run.infer_steps == 150 and run.infer.closed
    assert all(w.samples == 8 * w.steps for w in run.infer.closed)
    assert "your run" in run.line()  # an inference recommendation is judged on the inference windows


def test_a_failure_inside_turns_the_field_run_off_with_one_line_and_the_loop_goes_on():
    class Odd:  # a batch whose shape raises when read
        @property
        def shape(self):
            raise RuntimeError("no shape today")

    lines = []
    claim = Claim(median_samples_per_s=100.0)
    run = FieldRun(claim, spec=SPEC, log=lines.append, sink=lambda r: 1 / 0).start()
    run.batch(Odd())
    assert run.off == "RuntimeError: no shape today" and run._hook is None
    _loop(_Seen(None), 3)  # the user's loop runs on
    assert run.steps == 0  # nothing counted after it stopped
    run.stop()
    assert lines[0] == ("autotune field: measuring stopped (RuntimeError: no shape today); your training goes on "
                        "unmeasured")
    assert len([x for x in lines if x.startswith("autotune field: measuring stopped")]) == 1


def test_a_sink_that_fails_stops_the_writes_once_and_not_the_measurement():
    lines = []
    run = FieldRun(Claim(median_samples_per_s=100.0), spec=SPEC, log=lines.append, sink=lambda r: 1 / 0).start()
    _loop(_Seen(run), 30, wait_s=0.005)
    run.stop()
    assert run.steps == 30 and run.off is None
    assert [x for x in lines if "not kept" in x] == ["autotune field: this run's figures are not kept "
                                                     "(ZeroDivisionError: division by zero)"]


def test_apply_measures_by_default_and_field_false_registers_no_hook():
    from torch.optim.optimizer import _global_optimizer_post_hooks

    rec = make_rec(config=TrialConfig(batch_size=8), storage="")
    before = len(_global_optimizer_post_hooks)
    with rec.apply(field=False) as run:
        assert len(_global_optimizer_post_hooks) == before and run.field().startswith("autotune field: off")
    with rec.apply(field=SPEC) as run:
        assert len(_global_optimizer_post_hooks) == before + 1
        _loop(run, 5)
        assert run.field().startswith("autotune field: too short to judge: 5 steps")
    assert len(_global_optimizer_post_hooks) == before


def test_a_run_on_other_hardware_is_not_counted_as_evidence():
    run = FieldRun(Claim(100.0, (100.0, 101.0, 99.0), 4.3, fingerprint="aaaa"), spec=SPEC, log=lambda s: None,
                   fingerprint="bbbb").start()
    _loop(_Seen(run), 60, wait_s=0.003)
    line = run.stop(log=False)
    assert "on other hardware than the trials (this machine bbbb, the trials' aaaa): not counted as evidence" in line
    assert run.verdict() is None and run.to_dict()["other_hardware"] is True


def test_a_failure_in_the_watch_turns_the_watch_off_alone():
    lines = []
    run = FieldRun(Claim(median_samples_per_s=100.0), spec=SPEC, log=lines.append).start()

    def broken(w, index):
        raise ValueError("bad window")

    run.watch.on_window = broken
    _loop(_Seen(run), 40, wait_s=0.003)
    run.stop(log=False)
    assert run.watch is None and run.off is None and run.steps == 40
    assert lines == ["autotune field: the watch stopped (ValueError: bad window); the run is still measured"]


def test_an_evaluation_between_training_steps_is_the_loops_own_work_not_the_data_wait():
    rec = make_rec(config=TrialConfig(batch_size=8), storage="")
    run = FieldRun(rec.field_claim(), spec=FieldSpec(window_s=0.005), log=lambda s: None)
    seen, model = _Seen(run), torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.start()
    for _ in range(3):
        _loop(seen, 10, model=model, optimizer=opt)
        with torch.inference_mode():  # an evaluation of 5 batches, 10 ms each, between two training steps
            for _ in range(5):
                model(seen.prepare_input(torch.randn(8, 16)))
                time.sleep(0.01)
    _loop(seen, 10, model=model, optimizer=opt)
    run.stop(log=False)
    ws = run.train.closed
    outside, wait = sum(w.outside_s for w in ws), sum(w.wait_s for w in ws)
    assert outside >= 3 * 4 * 0.01 and wait < outside / 2, (outside, wait)  # 4 of each 5 sleeps at least


def test_rank_0_reports_the_ranks_from_their_records_in_the_study(tmp_path):
    """Under DDP each rank keeps its own record in the study (a real SQLite one here), tagged with the launch's
    group; rank 0's ``ranks()`` reads the other ranks' records of its group, waiting for the missing ones
    ``peer_wait_s`` at most, with no collective that a dead rank could hang: one line of every rank's figures."""
    import optuna

    from autotune.search.record.field_runs import study_records, study_sink

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="ddp", storage=storage)
    rec = make_rec(config=TrialConfig(batch_size=8), storage="")
    spec = FieldSpec(window_s=0.02, host_every_s=0.02, keep_every_s=10.0, peer_wait_s=0.5)

    def rank_run(rank: int, group: str, lines: list):
        run = FieldRun(rec.field_claim(), spec=spec, sink=study_sink(storage, "ddp"), log=lines.append, rank=rank,
                       world_size=3, group=group, peers=study_records(storage, "ddp"), steps="callback")
        run.start()
        for _ in range(100):  # a framework's hooks: a batch of 8 + 4 * rank, then the step's end
            run.batch_start(torch.zeros(8 + 4 * rank, 2))
            time.sleep(0.002)
            run.step_end()
        return run

    lines: list[str] = []
    rank_run(1, "127.0.0.1:29500/none/0", []).stop()
    rank_run(2, "127.0.0.1:29511/none/0", []).stop()  # another launch's rank 2: not this one's
    zero = rank_run(0, "127.0.0.1:29500/none/0", lines)
    t0 = time.monotonic()
    zero.stop()
    waited = time.monotonic() - t0
    said = [x for x in lines if "ranks:" in x]
    assert len(said) == 1, lines
    assert said[0].startswith("autotune field: 2 of 3 ranks: rank 0 ") and ", rank 1 " in said[0], said
    assert "slowest rank 0" in said[0] and said[0].endswith("rank 2 did not report within 0.5 s"), said
    assert 0.4 <= waited < 5.0  # it waited for rank 2, and not past peer_wait_s (plus the last write)
    kept = optuna.load_study(study_name="ddp", storage=storage).user_attrs.values()
    records = {(r["rank"], r["group"]) for r in kept}
    assert records == {(0, "127.0.0.1:29500/none/0"), (1, "127.0.0.1:29500/none/0"), (2, "127.0.0.1:29511/none/0")}
    # on the CPU no GPU figure is sampled, and none is said to be off
    assert not any("GPU" in x for x in lines) and all("gpu_sm_mhz" not in w.host for w in zero.train.closed)
    alone = FieldRun(rec.field_claim(), spec=spec, log=lines.append, rank=0, world_size=2, steps="callback")
    assert "figures are not known here: no study holds their records" in alone.ranks()


def test_a_paused_field_runs_thread_reads_no_host_figure_and_keeps_nothing(monkeypatch):
    """While paused the run's own thread samples nothing (the field benchmark's 'off' blocks carry none of the
    field run's work, so its on/off ratio holds all of it); it samples again on ``resume``. The CPU time it took
    is counted (``thread_cpu_s``, kept in the record), and not while it idles."""
    from autotune.field import host

    calls: list[float] = []
    real = host.HostSampler.sample

    def counted(self):
        calls.append(time.monotonic())
        return real(self)

    monkeypatch.setattr(host.HostSampler, "sample", counted)  # a spy: every call still samples
    run = FieldRun(Claim(median_samples_per_s=None), spec=SPEC, log=lambda s: None).start()
    try:
        time.sleep(0.3)
        assert len(calls) >= 3  # sampling every 0.02 s
        run.pause()
        time.sleep(0.05)  # a sample in flight at the pause ends
        paused_at, cpu_at = len(calls), run.thread_cpu_s
        assert cpu_at > 0 and run.to_dict()["field_thread_cpu_s"] == round(cpu_at, 4)  # its own cost, counted
        time.sleep(0.4)
        assert len(calls) == paused_at, "the paused run's thread sampled the host"
        assert run.thread_cpu_s == cpu_at  # an idle thread counts nothing
        run.resume()
        time.sleep(0.3)
        assert len(calls) >= paused_at + 3
    finally:
        run.stop()


def test_a_paused_field_run_measures_nothing_until_it_resumes():
    """``pause`` takes torch's step hook off and ignores batches (the field benchmark's 'off' blocks); ``resume``
    puts it back, and the pause counts as no step and no data wait."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    rec = make_rec(config=TrialConfig(batch_size=8), storage="")
    run = FieldRun(rec.field_claim(), spec=SPEC, log=lambda s: None)
    with rec.apply(field=False) as applied:
        applied._field = run.start()
        hooks = len(_global_optimizer_post_hooks)
        _loop(applied, 20, wait_s=0.005)
        run.pause()
        assert len(_global_optimizer_post_hooks) == hooks - 1
        _loop(applied, 10, wait_s=0.03)
        assert run.steps == 20
        run.resume()
        assert len(_global_optimizer_post_hooks) == hooks
        _loop(applied, 20, wait_s=0.005)
        run.stop()
    assert run.steps == 40 and run.off is None
    # no window spans the pause: the paused steps' 0.3 s of waiting is in none of them
    assert len(run.train.closed) >= 2 and all(w.wait_s / w.steps < 0.015 for w in run.train.closed), \
        run.train.closed
