#!/usr/bin/env bash
# A throwaway PostgreSQL server for the shared-storage tests (tests/search/record/test_postgres.py).
#
#   source .ci/postgres.sh     # starts it, exports AUTOTUNE_TEST_POSTGRES_URL, stops it when the shell exits
#   bash .ci/postgres.sh       # starts it and prints the export line; stop it with the printed pg_ctl command
#
# Installs Debian's `postgresql` package when no server binaries are found (needs root), then runs initdb and
# pg_ctl as the `postgres` user (initdb refuses root) in a fresh temporary directory, listening on 127.0.0.1
# only, on a free port, with trust authentication and durability off (fsync): it holds test data only.
# On any failure it says why on stderr and returns 1, so a caller can carry on without it.

_autotune_pg_fail() { echo "postgres.sh: $*" >&2; return 1; }

_autotune_pg_bin() {
    local dir
    if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v pg_ctl)")"  # /usr/local/bin may hold links to a few of them only
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return 0; fi
    done
    return 1
}

_autotune_pg_start() {
    local bin port dir as=()
    if ! bin=$(_autotune_pg_bin); then
        [ "$(id -u)" = 0 ] || { _autotune_pg_fail "no PostgreSQL server found and not root: apt-get install postgresql"; return 1; }
        echo "postgres.sh: installing Debian's postgresql package" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } >&2 \
            || { _autotune_pg_fail "apt-get install postgresql failed"; return 1; }
        bin=$(_autotune_pg_bin) || { _autotune_pg_fail "postgresql installed but pg_ctl/initdb not found"; return 1; }
    fi
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || { _autotune_pg_fail "running as root but there is no postgres user"; return 1; }
        as=(runuser -u postgres --)
    fi
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') \
        || { _autotune_pg_fail "could not find a free port"; return 1; }
    dir=$(mktemp -d "${TMPDIR:-/tmp}/autotune-pg.XXXXXX") || { _autotune_pg_fail "mktemp failed"; return 1; }
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; rm -rf "$dir"; _autotune_pg_fail "initdb failed"; return 1; }
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        start >/dev/null 2>&1 \
        || { cat "$dir/server.log" >&2 2>/dev/null; rm -rf "$dir"; _autotune_pg_fail "pg_ctl start failed"; return 1; }
    "${as[@]}" "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -q -v ON_ERROR_STOP=1 \
        -c "CREATE DATABASE autotune_test" >/dev/null \
        || { "${as[@]}" "$bin/pg_ctl" -D "$dir/data" stop -m immediate >/dev/null 2>&1; rm -rf "$dir"
             _autotune_pg_fail "CREATE DATABASE failed"; return 1; }
    AUTOTUNE_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/autotune_test"
    AUTOTUNE_TEST_POSTGRES_STOP="${as[*]} $bin/pg_ctl -D $dir/data stop -m fast && rm -rf $dir"
    echo "postgres.sh: PostgreSQL up at $AUTOTUNE_TEST_POSTGRES_URL (data in $dir)" >&2
}

if [ "${BASH_SOURCE[0]}" != "$0" ]; then  # sourced: export, and stop the server when the caller exits
    if _autotune_pg_start; then
        export AUTOTUNE_TEST_POSTGRES_URL
        # shellcheck disable=SC2064  # expand now: the stop command is fixed at start
        trap "{ $AUTOTUNE_TEST_POSTGRES_STOP; } >/dev/null 2>&1 || true" EXIT
    else
        false
    fi
else
    _autotune_pg_start || exit 1
    echo "export AUTOTUNE_TEST_POSTGRES_URL=$AUTOTUNE_TEST_POSTGRES_URL"
    echo "# stop it with: $AUTOTUNE_TEST_POSTGRES_STOP" >&2
fi
