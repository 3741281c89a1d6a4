"""The parent's watch on a trial's memory: the kernel's high-water marks (``VmHWM``) of the child and its
DataLoader workers, less the pages they share (from PSS), re-listed every ``runner`` poll; a forked child is
charged the pages it shares with its fork server (``lender``). Moved out of ``runner.py`` whole."""

from __future__ import annotations

import os
import time

__all__ = ["MemoryWatch"]


def _kb(path: str) -> dict[bytes, int] | None:
    """The ``kB`` fields of a /proc file (status, smaps_rollup) by name; None when the process is gone."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        key, _, rest = line.partition(b":")
        if rest.endswith(b" kB"):
            fields[key] = int(rest.split()[0])
    return fields


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time in clock ticks since boot)`` from /proc/PID/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()  # the name in parentheses may hold spaces
        return int(fields[1]), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None



class MemoryWatch:
    """The peak host memory of a process tree (the child and its DataLoader workers) as a bound that a peak
    shorter than a sample cannot slip under, and the memory cap's check. Linux: read from /proc.

    A sampler misses any peak shorter than its interval; the kernel's high-water mark of each process (``VmHWM``
    in /proc/PID/status, the most memory it ever had resident) misses none. But forked DataLoader workers map
    the main process's pages copy-on-write, so a plain sum of VmHWM over the tree (``peak_rss_mb``) counts
    those pages once per worker. So each process ``p`` is charged its high-water mark less the part of its
    resident memory that others in the tree are charged for:

        peak_mb = max over samples of  sum over live p of  VmHWM_p - shared_p
        shared_p = (RssAnon_p - Pss_Anon_p) + (RssShmem_p - Pss_Shmem_p) + (RssFile_p, workers only)

    PSS splits a shared page among its sharers. For anonymous pages they are all in the tree (a cold child was
    started afresh with exec, so its anonymous pages are shared only with its forks; a child forked by a fork
    server shares torch's imported heap with the server too, and the server's part is added: ``_lent``), and
    shared-memory pages are the batches workers hand to the main process. File pages (torch's libraries: hundreds of
    MiB) are shared with every process on the machine that loaded them, so PSS would charge a share that moves with
    whatever else runs (up to 400 MiB here); instead the main process is charged its own in full, as when it
    runs alone, and a worker's are taken to be the main process's libraries and not charged again.

    Why it bounds the true peak: memory a process frees after a peak leaves its RSS but not its VmHWM, so a
    step that touches 300 MiB for a few ms adds 300 MiB, and the sum at the next sample is at least what the
    tree held at any instant since the sample before: each process's part then was at most its VmHWM less its
    shared part then, and the shared part hardly grows in between. It grows at a fork, when the new process
    is charged its share of what it now shares; it moves at an exit; both make every process be read again.
    Otherwise it shrinks page by page as copy-on-write breaks, so a PSS reading up to a second old stands in.
    The tree is re-listed at every sample (0.1 s; /proc's pid list costs 0.1 ms, only new pids are read), so a
    worker started since is counted from the next sample on; one that exits stays counted in the samples it
    was alive for, through its last reading.

    Where it can read low: a spike in a worker's last 0.1 s before it exits; a process that starts and ends
    between two samples; a file a worker alone maps. Where it reads high: peaks of different processes at
    different times are added as if they were simultaneous. The cap is checked against the same bound at
    every sample, with every process's PSS read afresh before a kill.
    """

    _PSS_EVERY_S = 1.0

    def __init__(self, pid: int, *, lender: int | None = None) -> None:
        self.root = pid
        self.lender = lender  # a fork server the root was forked from: what it shares with the tree is the tree's
        self._lent_kb = 0
        self.peak_mb = 0.0
        self.peak_rss_mb = 0.0
        self._live: dict[int, list] = {pid: [0, {}, 0, -1e9]}  # pid -> [VmHWM, status, shared (kB), read at]
        self._outside: set[int] = set()  # pids seen that are not in the tree
        # every process ever seen in the tree -> its start time (a pid reused by another process is not killed)
        self._seen: dict[int, int] = {pid: (_stat(pid) or (0, 0))[1]}

    def _relist(self) -> bool:
        """Bring the tree up to date; True when a process joined or left it."""
        try:
            pids = {int(n) for n in os.listdir("/proc") if n.isdigit()}
        except OSError:
            return False
        self._outside &= pids  # a pid that ended may come back as someone else: it is looked at afresh
        changed = False
        new = sorted(pids - self._outside - self._live.keys())
        while new:
            stats = {p: _stat(p) for p in new}
            joined = [p for p in new if stats[p] is not None and stats[p][0] in self._live]
            for p in joined:
                self._live[p] = [0, {}, 0, -1e9]
                self._seen[p] = stats[p][1]
            changed = changed or bool(joined)
            if not joined:
                self._outside.update(new)
                break
            new = [p for p in new if p not in self._live]  # children of the newly joined, if any
        return changed

    def _read(self, *, pss: bool) -> float:
        """Read the tree; with ``pss``, every process's shared part afresh. Returns the bound now, in MiB."""
        for pid in list(self._live):
            status = _kb(f"/proc/{pid}/status")
            if not status or b"VmHWM" not in status:  # exited (or a zombie): counted while it lived
                del self._live[pid]
                pss = True  # what it shared is now another process's alone
            else:
                self._live[pid][:2] = status[b"VmHWM"], status
        now = time.monotonic()
        for pid, rec in list(self._live.items()):
            if pss or now - rec[3] >= self._PSS_EVERY_S:
                rollup = _kb(f"/proc/{pid}/smaps_rollup")
                if rollup is None:  # exited since its status was read (or Linux < 4.14): keep what we had
                    continue
                rec[2], rec[3] = self._shared_kb(rec[1], rollup, root=pid == self.root), now
                if pid == self.root and self.lender is not None:
                    self._lent_kb = self._lent(self.lender, rec[1])
        self.peak_rss_mb = max(self.peak_rss_mb, sum(r[0] for r in self._live.values()) / 1024)
        return (sum(max(0, r[0] - r[2]) for r in self._live.values()) + self._lent_kb) / 1024

    @staticmethod
    def _lent(server: int, root_status: dict) -> int:
        """What a fork server holds for the trial it forked: charged to the tree, the peak is what the trial would
        have held cold, having imported torch itself (tiny model here: 685 MiB cold, 418 forked without this).

        Anonymous: a cold child owns torch's imported heap (~0.4 GiB here); a forked one shares it with the
        server, so PSS charges the tree only part of each such page. The server's part is its ``Pss_Anon`` less
        its private pages (``Private_Dirty``: its anonymous pages are dirty, and those the child copied on
        write are the server's alone). Files: a cold child maps every library page the import touched (~0.3
        GiB); a forked one only those it touches itself, so the root is charged at least the server's file
        pages (a lower bound on the pages the import and the trial touch together). ``peak_rss_mb``, the plain
        sum kept as a diagnostic, is not corrected: forked it reads lower than cold (418 vs 685 MiB, tiny)."""
        rollup, status = _kb(f"/proc/{server}/smaps_rollup"), _kb(f"/proc/{server}/status")
        if not rollup or not status or b"Pss_Anon" not in rollup:  # gone, or Linux < 5.8: nothing added
            return 0
        anon = max(0, rollup[b"Pss_Anon"] - rollup.get(b"Private_Dirty", 0))
        return anon + max(0, status.get(b"RssFile", 0) - root_status.get(b"RssFile", 0))

    @staticmethod
    def _shared_kb(status: dict, rollup: dict, *, root: bool) -> int:
        """The part of a process's resident memory charged to others in the tree (see the class docstring)."""
        if b"Pss_Anon" not in rollup:  # before Linux 5.8: PSS over all kinds, file pages split machine-wide
            return max(0, rollup.get(b"Rss", 0) - rollup.get(b"Pss", 0))
        shared = max(0, status.get(b"RssAnon", 0) - rollup[b"Pss_Anon"])
        shared += max(0, status.get(b"RssShmem", 0) - rollup.get(b"Pss_Shmem", 0))
        return shared + (0 if root else status.get(b"RssFile", 0))

    def kill(self) -> list[int]:
        """SIGKILL the tree: the root's process group, and every process ever seen in the tree that still runs
        (one that called ``setsid`` left the group; one whose parent exited left the tree, unless a subreaper
        adopted it: ``autotune.machine.proctree``). Returns the pids signalled besides the group, to wait for."""
        import signal

        self._relist()  # whatever joined since the last sample
        try:
            os.killpg(self.root, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        killed = []
        for pid, started in self._seen.items():
            stat = _stat(pid)
            if pid == self.root or stat is None or stat[1] != started:  # gone, or its pid is someone else's now
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        return killed

    def sample(self, cap_mb: float | None) -> float | None:
        """Update the peak; return the bound when it is over ``cap_mb`` (confirmed with fresh PSS), else None."""
        mb = self._read(pss=self._relist())
        if cap_mb is not None and mb > cap_mb:
            mb = self._read(pss=True)
        self.peak_mb = max(self.peak_mb, mb)
        return mb if cap_mb is not None and mb > cap_mb else None
