# Sourced by tests/isolation/run.sh and tests/regress/run.sh: a throwaway PostgreSQL server for a suite run by
# one of PostgreSQL's own runners (pg_isolation_regress, pg_regress).
#
# The server lives in a private 0700 directory, listens only on a Unix socket there, and runs as the `postgres`
# OS user when the script runs as root (initdb and postgres refuse root). It is stopped and its directory removed
# when the script exits, unless the variable named by the keep argument is 1.
#
#   scratch_bindir                     prints the server's bindir (PG_BINDIR, else the newest
#                                      /usr/lib/postgresql/*/bin with initdb, else pg_config's); exits 2 if none
#   scratch_server_start NAME PORT MAX_CONNECTIONS KEEP_VAR
#                                      starts the server (needs $bindir); sets tmp, start_ns, PGHOST, PGPORT
#   as_server_user CMD...              runs CMD as postgres when root

scratch_bindir() {
    if [ -n "${PG_BINDIR:-}" ]; then echo "$PG_BINDIR"; return; fi
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -n -r); do
        if [ -x "$d/initdb" ]; then echo "$d"; return; fi
    done
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
        pg_config --bindir; return
    fi
    echo "run.sh: no PostgreSQL server binaries (initdb) found; install the postgresql package" >&2
    exit 2
}

as_server_user() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

scratch_server_start() {
    local name="$1" port="$2" max_connections="$3"
    scratch_keep_var="$4"
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
        echo "run.sh: running as root needs the postgres OS user to run the server (useradd --system postgres)" >&2
        exit 2
    fi
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/pgfence-$name.XXXXXX")"
    chmod 0700 "$tmp"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$tmp"
        if ! runuser -u postgres -- test -w "$tmp"; then
            echo "run.sh: the postgres OS user cannot reach $tmp (set TMPDIR to a directory it can traverse)" >&2
            rm -rf "$tmp"
            exit 2
        fi
    fi
    scratch_started=0
    trap scratch_cleanup EXIT
    start_ns=$(date +%s%N)
    as_server_user "$bindir/initdb" -D "$tmp/data" -U postgres --auth=trust --encoding=UTF8 --no-locale --no-sync \
        >"$tmp/initdb.log" 2>&1 || { cat "$tmp/initdb.log" >&2; exit 2; }
    as_server_user "$bindir/pg_ctl" -D "$tmp/data" -l "$tmp/server.log" -w -o \
        "-c listen_addresses='' -c unix_socket_directories='$tmp' -c port=$port -c fsync=off -c max_connections=$max_connections" \
        start >/dev/null || { cat "$tmp/server.log" >&2; exit 2; }
    scratch_started=1
    export PGHOST="$tmp" PGPORT="$port"
}

scratch_cleanup() {
    local rc=$?
    if [ "$scratch_started" = 1 ]; then
        as_server_user "$bindir/pg_ctl" -D "$tmp/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    if [ "${!scratch_keep_var:-0}" = 1 ]; then
        echo "run.sh: kept $tmp" >&2
    else
        rm -rf "$tmp"
    fi
    exit "$rc"
}
