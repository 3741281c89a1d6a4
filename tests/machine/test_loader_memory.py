"""The loader's memory rule (autotune.machine.loader_memory): arithmetic on fakes of statvfs and getrlimit, the limits
read from this machine, the failure texts torch writes, and the refusal of a loader that does not fit."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from types import SimpleNamespace

import pytest

from autotune.errors import ConfigError
from autotune.machine.loader_memory import (FD_RESERVE, LoaderLimits, check_loader, detect_limits, failure_kind,
                                            in_flight_batches, in_flight_bytes, pinned_bytes, shm_size_flag)

MiB = 2**20
BATCH64 = 64 * 3 * 224 * 224 * 4  # issue 41's batch: 64 crops at 224 px, 38.5 MB


def _statvfs(total_mb: float, free_mb: float, frsize: int = 4096):
    return lambda path: SimpleNamespace(f_blocks=int(total_mb * MiB) // frsize, f_bavail=int(free_mb * MiB) // frsize,
                                        f_frsize=frsize)


def _rlimits(nofile=(1024, 4096), memlock=(64 * 1024, 64 * 1024)):
    table = {resource.RLIMIT_NOFILE: nofile, resource.RLIMIT_MEMLOCK: memlock}
    return lambda which: table[which]


def test_in_flight_is_workers_times_prefetch_plus_the_batch_in_hand_per_rank():
    assert [in_flight_batches(w, p) for w, p in ((0, None), (0, 4), (1, 1), (2, None), (2, 2), (15, 4))] == \
        [0, 0, 2, 5, 5, 61]
    assert in_flight_bytes(BATCH64, 2, 2) == 5 * BATCH64  # issue 41's loader: 192.7 MB, over 64 MiB
    assert in_flight_bytes(BATCH64, 15, 4, ranks=8) == 61 * 8 * BATCH64  # an 8-GPU box: every rank's loader
    shm64 = LoaderLimits(shm_free_bytes=64 * MiB)  # 57.6 MiB for a loader, less the margin
    assert shm64.problems(BATCH64, 2, 2, 2)
    assert not shm64.problems(BATCH64 / 4, 2, 2, 2)  # batch 16: 5 x 9.6 MB = 48 MB < 57.6 MiB
    assert not LoaderLimits(shm_free_bytes=0).problems(BATCH64, 2, 0, None)  # no workers: nothing is shared


def test_the_largest_loader_lowers_the_prefetch_before_the_workers():
    """``LoaderLimits.largest``, the path the search's clamp and ``dataloader_kwargs(fit=True)`` take."""
    shm64 = LoaderLimits(shm_free_bytes=64 * MiB)
    assert shm64.largest(BATCH64 / 2, 2, 2, 4) == (2, 1)  # 3 x 19.3 MB fits, 5 does not
    assert shm64.largest(BATCH64, 2, 2, 2) == (0, None)  # even 1 x 1 + 1 = 2 batches is 77 MB
    assert shm64.largest(BATCH64 / 4, 2, 2, 2) == (2, 2)  # fits as asked
    # a 64-core host whose shared memory holds 4 batches (after the margin): 63 workers x prefetch 4 -> 3 x 1
    four = LoaderLimits(shm_free_bytes=int(4 * BATCH64 / 0.9) + 1)
    assert four.largest(BATCH64, 2, 63, 4) == (3, 1)


def test_every_function_of_the_rule_is_called_by_the_product():
    """Issue 52 item 6: a function of the rule that only tests call tests a path the product does not take (it had
    ``largest_loader`` and ``fits_shared_memory`` beside ``LoaderLimits.largest``). Read from the code (not its
    docstrings): each public function or class is referred to somewhere in ``autotune`` besides its definition."""
    import ast
    import pathlib

    import autotune.machine.loader_memory as rule

    used: set[str] = set()
    for path in pathlib.Path(rule.__file__).parents[1].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.alias):
                used.add(node.name)
    public = [n for n in rule.__all__ if callable(getattr(rule, n))]
    assert public and not [n for n in public if n not in used]


def test_each_overrun_pairs_its_problem_with_its_fix():
    """``problems`` and ``fixes`` read one table (``overruns``): the same limits, in the same order."""
    lim = LoaderLimits(shm_free_bytes=64 * MiB, ram_available_bytes=1024 * MiB, nofile_soft=300)
    for args in ((BATCH64, 8, 2, 4), (BATCH64 / 64, 8, 2, 4), (BATCH64 / 64, 80, 2, 4), (BATCH64, 1, 1, 1)):
        over = lim.overruns(*args, pin_memory=True)
        assert lim.problems(*args, pin_memory=True) == [p for p, _ in over]
        assert lim.fixes(*args, pin_memory=True) == [f for _, f in over]


def test_pinned_batches_count_the_host_allocators_power_of_two_rounding():
    """Issue 52 item 10: CUDA's host allocator rounds each pinned block up to a power of two and caches it, so a
    pin_memory loader pins up to twice its batches' bytes. 5 batches of 38.5 MB are 193 MB unrounded, under a
    quarter of 1 GiB (256 MiB); counted at the rounding's bound (385 MB) they are over it."""
    assert pinned_bytes(BATCH64, 2, 2) == 2 * 5 * BATCH64 and pinned_bytes(BATCH64, 0, None) == 2 * BATCH64
    lim = LoaderLimits(ram_available_bytes=1024 * MiB)
    assert 5 * BATCH64 < 256 * MiB
    (problem,) = lim.problems(BATCH64, 2, 2, 2, pin_memory=True)
    assert problem.startswith("pins up to ~368 MiB of host memory in flight (blocks rounded up to a power of two)")
    assert not lim.problems(BATCH64, 2, 2, 2, pin_memory=False)


def test_limits_are_read_from_statvfs_and_getrlimit():
    lim = detect_limits(statvfs=_statvfs(64, 60), getrlimit=_rlimits(), ram_available_bytes=8 * 2**30,
                        sharing_strategy="file_descriptor")
    assert (lim.shm_total_bytes, lim.shm_free_bytes) == (64 * MiB, 60 * MiB)
    assert (lim.nofile_soft, lim.nofile_hard, lim.memlock_soft) == (1024, 4096, 64 * 1024)
    assert lim.shm_budget_bytes == pytest.approx(60 * MiB * 0.9) and lim.shm_binding == "/dev/shm"
    assert lim.fd_budget == 1024 - FD_RESERVE
    unlimited = detect_limits(statvfs=_statvfs(64, 60), getrlimit=_rlimits(
        nofile=(resource.RLIM_INFINITY, resource.RLIM_INFINITY), memlock=(resource.RLIM_INFINITY, -1)))
    assert unlimited.nofile_soft is None and unlimited.memlock_hard is None and unlimited.fd_budget is None

    def missing(path):
        raise FileNotFoundError(path)

    nothing = detect_limits(statvfs=missing, getrlimit=_rlimits())  # macOS, a minimal container: nothing assumed
    assert nothing.shm_free_bytes is None and nothing.shm_budget_bytes is None
    assert nothing.problems(BATCH64, 2, 16, 8) == []


def test_a_container_memory_limit_below_dev_shm_binds_first():
    lim = detect_limits(statvfs=_statvfs(4096, 4096), getrlimit=_rlimits(), ram_available_bytes=512 * MiB)
    assert lim.shm_binding == "the memory available" and lim.shm_budget_bytes == pytest.approx(512 * MiB * 0.9)
    assert lim.fixes(BATCH64, 2, 15, 4) == ["more memory for the container (docker run --memory)"]


def test_problems_name_each_limit_overrun_and_the_option_for_it():
    lim = detect_limits(statvfs=_statvfs(64, 64), getrlimit=_rlimits(nofile=(300, 300)),
                        ram_available_bytes=1024 * MiB, sharing_strategy="file_descriptor")
    # 9 batches of 38.5 MB: shared memory; 9 x 8 tensors = 72 descriptors of the 44 left; 9 x 38.5 MB pinned > 256 MiB
    problems = lim.problems(BATCH64, 8, 2, 4, pin_memory=True)
    assert [p.split(" ")[0] for p in problems] == ["needs", "holds", "pins"], problems
    assert "over the 57.6 MiB /dev/shm leaves (64.0 MiB free, less 10%)" in problems[0]
    fixes = lim.fixes(BATCH64, 8, 2, 4, pin_memory=True)
    assert fixes[0] == "a /dev/shm of 1 GiB (docker run --shm-size=1g)"
    assert fixes[1] == 'an open-file limit of 328 (ulimit -n 328) or torch.multiprocessing.set_sharing_strategy(' \
                       '"file_system")'
    assert fixes[2] == "pin_memory=False, or more host memory"
    # file_system keeps no descriptor per tensor: only the shared memory and the pinned pages bind
    fs = detect_limits(statvfs=_statvfs(64, 64), getrlimit=_rlimits(nofile=(300, 300)),
                       ram_available_bytes=1024 * MiB, sharing_strategy="file_system")
    assert len(fs.problems(BATCH64, 8, 2, 4, pin_memory=True)) == 2
    assert lim.largest(BATCH64 / 8, 8, 2, 4) == (2, 2)  # 5 x 4.8 MB and 40 descriptors fit
    assert lim.largest(BATCH64 / 8, 20, 2, 4) == (1, 1)  # 20 tensors a batch: 2 x 20 of the 44 descriptors left


def test_shm_size_flag_holds_the_need_with_the_margin_in_whole_gib():
    assert [shm_size_flag(n) for n in (1, 0.9 * 2**30, 0.95 * 2**30, 2.3e9)] == \
        ["--shm-size=1g", "--shm-size=1g", "--shm-size=2g", "--shm-size=3g"]


@pytest.mark.parametrize("text, kind", [
    ("RuntimeError: unable to allocate shared memory(shm) for file </torch_1_2_0>: No space left on device (28)",
     "shm"),
    ("RuntimeError: unable to write to file </torch_18692_1954506624>: No space left on device (28)", "shm"),
    ("DataLoader worker (pid 7) is killed by signal: Bus error. It is possible that dataloader's workers are out of "
     "shared memory. Please try to raise your shared memory limit.", "shm"),
    ("RuntimeError: unable to open shared memory object </torch_1_2> in read-write mode: Too many open files (24)",
     "fds"),
    ("RuntimeError: received 0 items of ancdata", "fds"),
    ("RuntimeError: DataLoader worker (pid(s) 7) exited unexpectedly", None),
    ("DefaultCPUAllocator: can't allocate memory", None),
])
def test_failure_kind_reads_what_torch_writes(text, kind):
    assert failure_kind(RuntimeError(text)) == kind


def test_a_loader_that_does_not_fit_is_refused_in_one_line_with_its_options():
    lim = detect_limits(statvfs=_statvfs(64, 64), getrlimit=_rlimits(nofile=(4096, 4096)),
                        ram_available_bytes=8 * 2**30)
    with pytest.raises(ConfigError) as info:
        check_loader(64, 2, 2, (BATCH64, 2), limits=lim)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("the recommended loader (batch 64, 2 worker(s) x prefetch_factor 2, 5 "
                                              "batches of 36.8 MiB in flight) does not fit this machine")
    assert "docker run --shm-size=1g" in msg and msg.endswith("dataloader_kwargs(fit=True) for the largest loader "
                                                              "that fits here (0 workers)")
    assert check_loader(64, 2, 2, (BATCH64, 2), limits=lim, fit=True) == (0, None)
    assert check_loader(32, 2, 4, (BATCH64 / 2, 2), limits=lim, fit=True) == (2, 1)
    assert check_loader(16, 2, 2, (BATCH64 / 4, 2), limits=lim) is None  # fits: as it is
    assert check_loader(64, 2, 2, None, limits=lim) is None  # its batch unknown: nothing assumed


def test_this_machines_limits_are_what_the_shell_reports():
    """The real calls: statvfs of /dev/shm as df reads it, the soft open-file limit as `ulimit -n` says it."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm on this system")
    lim = detect_limits()
    st = os.statvfs("/dev/shm")
    assert lim.shm_total_bytes == st.f_blocks * st.f_frsize
    shell = subprocess.run(["sh", "-c", "ulimit -n"], capture_output=True, text=True).stdout.strip()
    assert str(lim.nofile_soft) == shell or (shell == "unlimited" and lim.nofile_soft is None)
    with_torch = subprocess.run([sys.executable, "-c", "import torch; print(torch.multiprocessing."
                                 "get_sharing_strategy())"], capture_output=True, text=True).stdout.strip()
    assert with_torch in ("file_descriptor", "file_system")
