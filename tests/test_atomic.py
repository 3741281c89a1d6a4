"""``atomic_write`` (what `export`, `show --csv` and the report write through): a reader sees the old file or the
new, and once it returns the new one is on disk: the data fsynced before the rename, the folder after it. The
system calls are watched with a real ``strace`` of a real child."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from autotune._atomic import atomic_write


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "best.yaml"
    target.write_text("old\n")
    atomic_write(target, "new\n")
    assert target.read_text() == "new\n" and os.listdir(tmp_path) == ["best.yaml"]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (apt-get install strace)")
def test_the_folder_is_fsynced_after_the_rename(tmp_path):
    target = tmp_path / "out" / "best.yaml"
    code = ("from pathlib import Path; from autotune._atomic import atomic_write; "
            f"atomic_write(Path({str(target)!r}), 'x')")
    out = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,fsync,fdatasync,rename,renameat,renameat2",
                          sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0 and "ptrace" in out.stderr:
        pytest.skip(f"strace cannot trace here: {out.stderr.strip().splitlines()[-1]}")
    assert out.returncode == 0, out.stderr[-2000:]
    calls = [ln for ln in out.stderr.splitlines() if re.search(r"\b(openat|fsync|fdatasync|rename\w*)\(", ln)]
    renamed = next(i for i, ln in enumerate(calls) if "rename" in ln and str(target) in ln and "= 0" in ln)
    folder = str(target.parent)
    opened = [re.search(r"=\s*(\d+)$", ln) for ln in calls[renamed:]
              if "openat(" in ln and f'"{folder}"' in ln and "O_DIRECTORY" in ln]
    fds = {m.group(1) for m in opened if m}
    assert fds, f"the folder was not opened after the rename: {calls[renamed:]}"
    assert any(re.search(rf"\bfsync\(({'|'.join(fds)})\)\s*= 0", ln) for ln in calls[renamed:]), calls[renamed:]
