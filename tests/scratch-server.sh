# Sourced by tests/isolation/run.sh and tests/regress/run.sh: a throwaway PostgreSQL server for a suite run by
# one of PostgreSQL's own runners (pg_isolation_regress, pg_regress).
#
# The server lives in a private 0700 directory, listens only on a Unix socket there, and runs as the `postgres`
# OS user when the script runs as root (initdb and postgres refuse root). It is stopped and its directory removed
# when the script exits, unless the variable named by the keep argument is 1.
#
#   scratch_bindir                     prints the server's bindir: PG_BIN (authoritative: exits 2 when it lacks
#                                      initdb, pg_ctl or postgres), else pg_ctl's on PATH, else the newest
#                                      /usr/lib/postgresql/*/bin with initdb; exits 2 if none
#   scratch_clientdir TOOL             prints the bindir of the installation whose client programs run the suite:
#                                      psql and lib/TOOL (a runner under pgxs, e.g. pgxs/src/test/regress/pg_regress)
#                                      of the server's own installation, else of the newest Debian client
#                                      installation that has both (saying so on stderr); exits 2 if none
#   scratch_server_start NAME PORT MAX_CONNECTIONS KEEP_VAR
#                                      starts the server (needs $bindir); sets tmp, start_ns, PGHOST, PGPORT
#   as_server_user CMD...              runs CMD as postgres when root

scratch_bindir() {
    if [ -n "${PG_BINDIR:-}" ] && [ -z "${PG_BIN:-}" ]; then
        echo "run.sh: PG_BINDIR is not read; set PG_BIN to the directory of the server binaries" >&2
        exit 2
    fi
    local d tool
    if [ -n "${PG_BIN:-}" ]; then
        for tool in initdb pg_ctl postgres; do
            if [ ! -x "$PG_BIN/$tool" ]; then
                echo "run.sh: PG_BIN=$PG_BIN has no $tool (it must hold initdb, pg_ctl and postgres)" >&2
                exit 2
            fi
        done
        echo "$PG_BIN"; return
    fi
    if d="$(command -v pg_ctl 2>/dev/null)" && d="$(dirname "$(readlink -f "$d")")" && [ -x "$d/initdb" ] \
        && [ -x "$d/postgres" ]; then
        echo "$d"; return
    fi
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -n -r); do
        if [ -x "$d/initdb" ]; then echo "$d"; return; fi
    done
    echo "run.sh: no PostgreSQL server binaries (initdb) found; install the postgresql package or set PG_BIN" >&2
    exit 2
}

scratch_clientdir() {
    local tool="$1" d
    if [ -x "$bindir/psql" ] && [ -x "$bindir/../lib/$tool" ]; then
        echo "$bindir"; return
    fi
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -n -r); do
        if [ -x "$d/psql" ] && [ -x "$d/../lib/$tool" ]; then
            echo "run.sh: the server's installation ($bindir) has no psql or $(basename "$tool"): the client" \
                "programs are $d's (the server is $bindir's)" >&2
            echo "$d"; return
        fi
    done
    echo "run.sh: no psql with $(basename "$tool") (lib/$tool) found;" \
        "install postgresql-client-NN (Debian)" >&2
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
