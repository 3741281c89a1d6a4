"""The loader's memory as a constraint of the search (search.space.loader_fit, search.record.loader_statement): configs
over the machine's shared memory are clamped before they run, with one note; the ceilings' climb stops at the most
workers that fit; the recommendation says what its loader needs and what more would buy.

The machine's limits are faked here (a 1 MiB or 64 MiB /dev/shm on the detected Hardware): what is under test is
the arithmetic and what the tuner asks for. The real mechanism, a real /dev/shm of 64 MiB, is in
tests/trial/test_loader_watch.py and tests/search/test_loader_memory_run.py."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from autotune import MeasureSpec, Workload
from autotune.config import TrialConfig, TrialResult
from autotune.machine.hardware import detect
from autotune.machine.loader_memory import LoaderLimits, in_flight_bytes
from autotune.recommendation import Recommendation
from autotune.search.space.search_space import space_for, space_from_dict
from autotune.search.tuner import Tuner
from autotune.workloads.build import profile
from autotune.workloads.probe import footprint_at

MiB = 2**20
TINY = Workload(model="tests.workloads_fixtures:tiny", image_size=16)
HW = dataclasses.replace(detect(with_torch=False), compiler="g++", libc="glibc 2.36", usable_cores=8)
QUICK = MeasureSpec(windows=3, window_s=0.2, timeout_s=120, memory_cap_mb=4096.0)


def pipeline(model_rate: float, per_worker: float):
    """A fake trial runner: the model alone ``model_rate`` samples/s, the data path ``per_worker`` a worker (one
    worker's worth in the training loop with none, serialised with the model); end to end the slower of the two."""
    calls: list[tuple[str, TrialConfig]] = []

    def run(workload, c, measure, **kw):
        calls.append((measure.part, c))
        data = per_worker * (c.num_workers or 1)
        rate = {"model": model_rate, "data": data}.get(measure.part) or (
            1 / (1 / model_rate + 1 / data) if c.num_workers == 0 else min(model_rate, data))
        wait = max(0.0, 1 / rate - 1 / model_rate)
        return TrialResult(status="ok", samples_per_s=(0.99 * rate, rate, 1.01 * rate), wall_s=20.0, peak_host_mb=10.0,
                           batch_size=c.batch_size, data_wait_s_per_step=wait * c.batch_size,
                           compute_s_per_step=c.batch_size / model_rate, cpu_cores_used=1.0)

    run.calls = calls
    return run


def _hw(shm_mib: float, **limits):
    lim = LoaderLimits(shm_total_bytes=int(shm_mib * MiB), shm_free_bytes=int(shm_mib * MiB),
                       ram_available_bytes=16 * 2**30, nofile_soft=1024, nofile_hard=4096, **limits)
    return dataclasses.replace(HW, loader_memory=lim.to_dict())


def _space(hw, **over):
    doc = {"name": "fake", "device": "cpu", "parameters": {
        "batch_size": {"type": "int", "choices": [32, 64]},
        "num_workers": {"type": "int", "low": 0, "high": "cores"},
        "prefetch_factor": {"type": "int", "choices": [2, 4], "when": "num_workers > 0"},
        "persistent_workers": {"type": "bool", "when": "num_workers > 0"},
        "amp": {"type": "categorical", "choices": ["off", "bf16"]}},
        "baseline": {"batch_size": 64, "num_workers": 0, "amp": "off"}}
    doc.update(over)
    return space_from_dict(doc, hardware=hw)


def _batch(bs: int) -> float:
    return footprint_at(profile(TINY), bs)[0]


def test_the_probe_gives_the_tiny_workloads_batch_bytes():
    # 3 x 16 x 16 float32 images and int64 labels: 3080 bytes a sample, two tensors a batch
    assert footprint_at(profile(TINY), 64) == (64 * 3080, 2)


def test_configs_over_the_shared_memory_run_with_a_smaller_prefetch_then_fewer_workers():
    hw = _hw(1.0)  # 0.9 MiB for the loader: 4 batches of 64 (197 kB), 9 of 32
    space = space_for(TINY, hw, space=_space(hw))
    assert space.effective({"batch_size": 64, "num_workers": 8, "prefetch_factor": 4}).short().startswith(
        "bs=64 w=3 pf=1")
    assert space.effective({"batch_size": 32, "num_workers": 8, "prefetch_factor": 4}).short().startswith(
        "bs=32 w=8 pf=1")
    assert space.effective({"batch_size": 32, "num_workers": 2, "prefetch_factor": 2}).short().startswith(
        "bs=32 w=2 pf=2")  # fits as sampled
    budget = hw.loader_limits.shm_budget_bytes
    for bs in (32, 64):
        for w in range(9):
            for p in (2, 4):
                c = space.effective({"batch_size": bs, "num_workers": w, "prefetch_factor": p})
                assert in_flight_bytes(_batch(bs), c.num_workers, c.prefetch_factor) <= budget
    (note,) = [n for n in space.notes if n.startswith("loader memory:")]
    assert "at batch 64 with 8 workers x prefetch 4 a loader needs ~6.2 MiB of shared memory in flight, over the " \
           "0.9 MiB /dev/shm leaves (1.0 MiB free, less 10%)" in note, note
    assert "(batch 32: 8 worker(s) x prefetch 1; batch 64: 3 worker(s) x prefetch 1)" in note
    assert note.endswith("to search them all: a /dev/shm of 1 GiB (docker run --shm-size=1g)")
    assert space.to_dict()["loader_memory"]["limits"]["shm_free_bytes"] == MiB


def test_ranks_on_one_host_share_its_shared_memory():
    hw = _hw(1.0)
    two = space_for(dataclasses.replace(TINY, nproc_per_node=2, data=profile(TINY)), hw, space=_space(hw))
    # each of the 2 ranks' loaders holds its batches: 2 x (w x 1 + 1) x 197 kB within 0.9 MiB -> 1 worker a rank
    assert two.effective({"batch_size": 64, "num_workers": 4, "prefetch_factor": 4}).num_workers == 1


def test_a_roomy_machine_or_an_unknown_footprint_leaves_the_space_alone():
    roomy = _hw(4096.0)
    space = space_for(TINY, roomy, space=_space(roomy))
    assert not any(n.startswith("loader memory") for n in space.notes)
    assert space.effective({"batch_size": 64, "num_workers": 8, "prefetch_factor": 4}).num_workers == 8
    unread = dataclasses.replace(HW, loader_memory=None)  # a snapshot from before the limits were read
    assert space_for(TINY, unread, space=_space(unread)).loader is None


def test_the_search_never_runs_a_loader_over_the_shared_memory_and_says_what_more_would_buy(tmp_path):
    """A data-bound pipeline (a worker 140 samples/s, the model 1000) on 8 cores with 1 MiB of /dev/shm: the climb
    stops at the 3 workers that fit at batch 64, every config asked for fits, the note and the recommendation say
    the limit, and the recommendation's loader passes where it is applied (this machine's /dev/shm is larger)."""
    hw = _hw(1.0)
    runner, logs = pipeline(1000.0, 140.0), []
    tuner = Tuner(TINY, space=_space(hw), hardware=hw, measure=QUICK, storage=f"sqlite:///{tmp_path}/t.db",
                  progress=False, runner=runner, parity_steps=0, seed=0, finalists=2, finalist_rounds=1,
                  log=logs.append)
    rec = tuner.run(trials=4)
    budget = hw.loader_limits.shm_budget_bytes
    assert all(in_flight_bytes(_batch(c.batch_size), c.num_workers, c.prefetch_factor) <= budget
               for _, c in runner.calls)
    data = [c.num_workers for part, c in runner.calls if part == "data"]
    assert data and max(data) == 3 and any("the data path's climb stops at 3 worker(s)" in m for m in logs), data
    assert any(w > 0 for _, c in runner.calls for w in (c.num_workers,))  # workers that fit still run
    lm = rec.loader_memory
    assert lm["fits"] and lm["in_flight_bytes"] <= budget and not lm["batch_measured"]  # the fake measured no batch
    assert lm["line"].startswith("loader memory: ") and lm["line"] in rec.summary()
    if rec.config.num_workers:
        assert "fits /dev/shm (1.0 MiB free, 0.9 MiB less 10%)" in lm["line"]
    if lm["limited"]:
        assert lm["options"] == ["a /dev/shm of 1 GiB (docker run --shm-size=1g)"]
        assert "with a /dev/shm of 1 GiB (docker run --shm-size=1g) it could try them" in lm["line"]
    back = Recommendation.from_dict(yaml.safe_load(rec.to_yaml()))
    assert back.loader_memory == lm
    kw = back.dataloader_kwargs()  # this machine's /dev/shm holds it; a timeout where workers run (issue 52)
    assert kw == {**rec.config.dataloader_kwargs(), **({"timeout": 300} if rec.config.num_workers else {})}


def test_a_statement_of_a_loader_that_no_longer_fits_says_so():
    from autotune.search.record.loader_statement import statement

    lim = LoaderLimits(shm_total_bytes=64 * MiB, shm_free_bytes=64 * MiB, ram_available_bytes=16 * 2**30)
    c = TrialConfig(batch_size=64, num_workers=2, prefetch_factor=2, persistent_workers=True)
    s = statement(c, (38_535_168, 2), measured=True, limits=lim, offered=(2, 4))
    assert not s["fits"] and s["in_flight_bytes"] == 5 * 38_535_168
    assert s["line"].startswith("loader memory: 2 worker(s) x prefetch_factor 2 + 1 = 5 batches of 36.8 MiB, "
                                "184 MiB in flight when the loop pauses: does NOT fit /dev/shm")
    zero = statement(TrialConfig(batch_size=64), (38_535_168, 2), measured=True, limits=lim, offered=(2, 4))
    assert zero["fits"] and zero["limited"] and zero["options"] == ["a /dev/shm of 1 GiB (docker run "
                                                                    "--shm-size=1g)"]
    assert zero["line"] == ("loader memory: no workers, so nothing in shared memory (the training process loads); "
                            "the machine's limits held the search to this at batch 64 (the space offers 2 worker(s) "
                            "x prefetch_factor 4): with a /dev/shm of 1 GiB (docker run --shm-size=1g) it could "
                            "try them")
    assert statement(c, None, measured=False, limits=lim) is None


@pytest.mark.parametrize("shm_mib, refused", [(1.0, True), (4096.0, False)])
def test_dataloader_kwargs_judge_the_machine_they_are_applied_on(monkeypatch, shm_mib, refused):
    """``dataloader_kwargs()`` reads the limits where it runs (``hardware.loader_limits_now``, faked here to the
    given /dev/shm): refused in one line, or the largest loader that fits with ``fit=True``."""
    import autotune.machine.hardware as hardware
    from autotune.errors import ConfigError

    from tests.helpers import make_rec

    lim = LoaderLimits(shm_total_bytes=int(shm_mib * MiB), shm_free_bytes=int(shm_mib * MiB),
                       ram_available_bytes=16 * 2**30)
    monkeypatch.setattr(hardware, "loader_limits_now", lambda: lim)
    rec = make_rec(config=TrialConfig(batch_size=64, num_workers=8, prefetch_factor=4, persistent_workers=True),
                   workload=dataclasses.replace(TINY, data=profile(TINY)))
    if not refused:
        assert rec.dataloader_kwargs()["num_workers"] == 8
        return
    with pytest.raises(ConfigError, match=r"^the recommended loader \(batch 64, 8 worker\(s\) x prefetch_factor 4, 33 "
                                          r"batches of 0.2 MiB") as info:
        rec.dataloader_kwargs()
    assert "\n" not in str(info.value)
    with pytest.warns(UserWarning, match="3 worker"):
        kw = rec.dataloader_kwargs(fit=True)
    assert (kw["num_workers"], kw["prefetch_factor"]) == (3, 1)


def test_on_a_gpu_the_likely_winners_trade_batch_for_the_workers_the_loader_memory_holds_back():
    """Issue 42's shm64 host: a small /dev/shm holds 3 workers at batch 64 (prefetch 1), the hint asks for a rank's
    cores less one (7): the likely winners run batch 32, where all 7 fit, instead of 3 workers at 64. A roomy
    machine keeps the baseline's batch."""
    hw = _hw(1.0)  # 0.9 MiB for the loader: (w x 1 + 1) batches of 64 (197 kB) -> 3 workers; of 32 -> 8
    space = space_for(TINY, hw, space=_space(hw, device="cuda"))
    likely = space.likely_params()
    assert likely["batch_size"] == 32, likely
    c = space.effective(likely)
    assert (c.batch_size, c.num_workers, c.prefetch_factor) == (32, 7, 1)
    assert in_flight_bytes(_batch(32), c.num_workers, c.prefetch_factor) <= hw.loader_limits.shm_budget_bytes
    roomy = _hw(4096.0)
    likely = space_for(TINY, roomy, space=_space(roomy, device="cuda")).likely_params()
    assert (likely["batch_size"], likely["num_workers"]) == (64, 7)
