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
from autotune.machine.loader_memory import (FD_RESERVE, check_loader, detect_limits, failure_kind,
                                            fits_shared_memory, in_flight_batches, in_flight_bytes, largest_loader,
                                            shm_size_flag)

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
    assert not fits_shared_memory(BATCH64, 2, 2, free_bytes=64 * MiB)
    assert fits_shared_memory(BATCH64 / 4, 2, 2, free_bytes=64 * MiB)  # batch 16: 5 x 9.6 MB = 48 MB < 57.6 MiB
    assert fits_shared_memory(BATCH64, 0, None, free_bytes=0)  # no workers: nothing is shared


def test_the_largest_loader_lowers_the_prefetch_before_the_workers():
    budget = 64 * MiB * 0.9
    assert largest_loader(BATCH64 / 2, 2, 4, budget_bytes=budget) == (2, 1)  # 3 x 19.3 MB fits, 5 does not
    assert largest_loader(BATCH64, 2, 2, budget_bytes=budget) == (0, None)  # even 1 x 1 + 1 = 2 batches is 77 MB
    assert largest_loader(BATCH64 / 4, 2, 2, budget_bytes=budget) == (2, 2)  # fits as asked
    # a 64-core host whose shared memory holds 4 batches: a rank's cores less one, prefetch 4 -> 3 workers x 1
    assert largest_loader(BATCH64, 63, 4, budget_bytes=4 * BATCH64) == (3, 1)


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
