#!/usr/bin/env bash
# Run a command as on a fresh machine without the optional system packages (issue 37):
#
#   .ci/without-extras.sh python -m pytest
#
# Hidden from the product and the tests, each through the same check they use to find it:
#   - the preloaded allocators (libtcmalloc-minimal4, libjemalloc2): autotune.machine.malloc.preload_path
#   - Chromium: shutil.which("chromium") / ("chromium-browser"), as tests/view/test_browser.py looks for it
#   - the C/C++ compilers and Python.h: Hardware.compiler / python_headers() (autotune.machine.hardware), and
#     gcc/cc/clang, which a fresh machine lacks as well
#   - PostgreSQL: AUTOTUNE_TEST_POSTGRES_URL is unset (it is how the tests find a server)
# Each file found is covered with /dev/null (a bind mount, not a regular file, not executable) in a private mount
# namespace (unshare --mount, as root): the command and its children see them absent; nothing changes outside.
# Before running the command it checks that the product really finds none of them. Where none is installed it runs
# the command as is; where some are but no mount namespace can be made, it fails and says so.
set -euo pipefail
self=$(readlink -f "$0")
cd "$(dirname "$self")/.."  # the command runs in the repository's root, with this checkout's autotune

_hide_fail() { echo "without-extras.sh: $*" >&2; exit 1; }

# One file the product or the tests would use now, or nothing. Called again after each one is hidden, until none.
_hide_next() {
    python - <<'EOF'
import shutil
from autotune.machine.malloc import PRELOAD_LIBS, preload_path
from autotune.machine.hardware import detect, python_headers

for mode in PRELOAD_LIBS:
    if preload_path(mode):
        raise SystemExit(print(preload_path(mode)))
for name in ("chromium", "chromium-browser", "gcc", "cc", "clang"):
    if shutil.which(name):
        raise SystemExit(print(shutil.which(name)))
hw = detect(with_torch=False)
if hw.compiler:
    raise SystemExit(print(shutil.which(hw.compiler) or hw.compiler))
if python_headers():
    import os, sysconfig
    raise SystemExit(print(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
EOF
}

if [ "${_AUTOTUNE_EXTRAS_HIDDEN:-}" != 1 ]; then
    [ $# -gt 0 ] || _hide_fail "usage: .ci/without-extras.sh COMMAND [ARGS...]"
    if [ -z "$(_hide_next)" ]; then  # nothing installed to hide: the machine is already as a fresh one
        echo "without-extras.sh: none of the optional packages is installed here; running: $*" >&2
        exec env -u AUTOTUNE_TEST_POSTGRES_URL "$@"
    fi
    [ "$(id -u)" = 0 ] || _hide_fail "optional packages are installed here and hiding them needs root (a mount namespace)"
    unshare --mount true 2>/dev/null \
        || _hide_fail "optional packages are installed here and unshare --mount is not permitted (needs CAP_SYS_ADMIN)"
    exec unshare --mount --propagation private env _AUTOTUNE_EXTRAS_HIDDEN=1 bash "$self" "$@"
fi

# In the private mount namespace: cover each file the product finds until it finds none.
hidden=()
for _ in $(seq 50); do
    path=$(_hide_next)
    [ -n "$path" ] || break
    mount --bind /dev/null "$path" || _hide_fail "could not cover $path"
    hidden+=("$path")
done
[ -z "$(_hide_next)" ] || _hide_fail "still found after 50 files hidden: $(_hide_next)"
echo "without-extras.sh: hidden (covered with /dev/null in a private mount namespace): ${hidden[*]}" >&2
echo "without-extras.sh: running: $*" >&2
exec env -u AUTOTUNE_TEST_POSTGRES_URL -u _AUTOTUNE_EXTRAS_HIDDEN "$@"
