#!/usr/bin/env bash
# Run a command next to a throwaway PostgreSQL server:  scripts/with-postgres.sh CMD [ARGS...]
#
# It initialises a cluster in a new temporary folder, starts it listening on a Unix socket in that folder only (no
# TCP port, so nothing can clash with another server), creates the database `perfmodel_test`, exports
# PERFMODEL_TEST_POSTGRES_URL (a SQLAlchemy URL with the psycopg driver) and runs CMD. On exit the server is
# stopped and the folder removed, and the script exits with CMD's exit code.
#
# The server binaries are looked up on PATH, then in /usr/lib/postgresql/*/bin (newest first). Where there are
# none and we are root with apt-get, Debian's `postgresql` package is installed. PostgreSQL refuses to run as root,
# so as root the server runs as the `postgres` system user (created if missing).
#
# It also exports PERFMODEL_TEST_POSTGRES_DATA (the server's data folder) and PERFMODEL_TEST_POSTGRES_CTL (its
# pg_ctl), for a test that stops and starts a server (the fault-injection test starts its own from these binaries).
#
# If PERFMODEL_TEST_POSTGRES_URL is already set, CMD runs against that server and nothing is started. If no server
# can be installed or started, one line on stderr says why, CMD runs without the variable (the PostgreSQL tests then
# skip, quoting PERFMODEL_TEST_POSTGRES_SKIP_REASON) and its exit code is returned all the same.
set -uo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 CMD [ARGS...]" >&2
  exit 2
fi

DB_NAME=perfmodel_test
DB_USER=postgres
START_TIMEOUT_S=60
say() { echo "with-postgres: $*" >&2; }

if [ -n "${PERFMODEL_TEST_POSTGRES_URL:-}" ]; then
  say "PERFMODEL_TEST_POSTGRES_URL is already set; using that server"
  "$@"
  exit $?
fi

run_without() {  # run CMD with no server; $1 says why
  say "no PostgreSQL server for the tests: $1; PostgreSQL tests will skip"
  export PERFMODEL_TEST_POSTGRES_SKIP_REASON="scripts/with-postgres.sh could not start a server: $1"
  shift
  "$@"
}

# A folder holding initdb, pg_ctl and postgres, or nothing.
find_bindir() {
  local pg_ctl dir
  if pg_ctl="$(command -v pg_ctl 2>/dev/null)"; then
    dir="$(dirname "$(readlink -f "$pg_ctl")")"
    if [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return
    fi
  fi
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$dir/pg_ctl" ] && [ -x "$dir/initdb" ] && [ -x "$dir/postgres" ]; then
      echo "$dir"
      return
    fi
  done
}

install_postgres() {  # Debian's package; quiet unless it fails
  local log
  log="$(mktemp)"
  say "no PostgreSQL server binaries found; installing Debian's postgresql package"
  if DEBIAN_FRONTEND=noninteractive timeout 900 apt-get update -q >"$log" 2>&1 \
    && DEBIAN_FRONTEND=noninteractive timeout 1200 apt-get install -y -q --no-install-recommends postgresql \
      >>"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  tail -n 5 "$log" >&2
  rm -f "$log"
  return 1
}

bindir="$(find_bindir)"
if [ -z "$bindir" ]; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    install_postgres || true
    bindir="$(find_bindir)"
  fi
fi
if [ -z "$bindir" ]; then
  run_without "no PostgreSQL server binaries (pg_ctl, initdb, postgres) on PATH or in /usr/lib/postgresql/*/bin" "$@"
  exit $?
fi

# As root, run the server as an unprivileged user.
as_server=()
if [ "$(id -u)" -eq 0 ]; then
  if ! id -u postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin postgres >/dev/null 2>&1 \
      || { run_without "cannot create the unprivileged user 'postgres' to run the server as" "$@"; exit $?; }
  fi
  if command -v runuser >/dev/null 2>&1; then
    as_server=(runuser -u postgres --)
  else
    as_server=(su postgres -s /bin/sh -c '"$0" "$@"')
  fi
fi

# The socket path must fit in 107 bytes, so the folder goes under /tmp whatever TMPDIR says.
cluster="$(mktemp -d /tmp/perfmodel-pg.XXXXXX)" || { run_without "cannot create a temporary folder" "$@"; exit $?; }
started=0
cleanup() {
  if [ "$started" -eq 1 ]; then
    "${as_server[@]}" "$bindir/pg_ctl" -D "$cluster/data" -m fast -w -t 30 stop >/dev/null 2>&1 \
      || "${as_server[@]}" "$bindir/pg_ctl" -D "$cluster/data" -m immediate -w -t 10 stop >/dev/null 2>&1
    started=0
  fi
  rm -rf "$cluster"
}
trap cleanup EXIT
trap 'cleanup; trap - INT; kill -INT $$' INT
trap 'cleanup; trap - TERM; kill -TERM $$' TERM
chmod 755 "$cluster"
[ "$(id -u)" -eq 0 ] && chown postgres: "$cluster"

start_server() {
  "${as_server[@]}" "$bindir/initdb" -D "$cluster/data" -U "$DB_USER" --auth=trust -E UTF8 --locale=C.UTF-8 \
    >"$cluster/initdb.log" 2>&1 \
    || "${as_server[@]}" "$bindir/initdb" -D "$cluster/data" -U "$DB_USER" --auth=trust -E UTF8 --locale=C \
      >"$cluster/initdb.log" 2>&1 \
    || { why="initdb failed: $(tail -n 1 "$cluster/initdb.log")"; return 1; }
  # Unix socket only; durability traded for speed (a crash loses a throwaway database, nothing else).
  "${as_server[@]}" "$bindir/pg_ctl" -D "$cluster/data" -l "$cluster/server.log" -w -t "$START_TIMEOUT_S" \
    -o "-c listen_addresses='' -k $cluster -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null 2>&1 \
    || { why="the server did not start: $(tail -n 1 "$cluster/server.log" 2>/dev/null)"; return 1; }
  started=1
  if ! "$bindir/pg_isready" -q -h "$cluster" -U "$DB_USER" -t 20 >/dev/null 2>&1; then
    why="the server does not accept connections (pg_isready)"
    return 1
  fi
  "$bindir/createdb" -h "$cluster" -U "$DB_USER" "$DB_NAME" >"$cluster/createdb.log" 2>&1 \
    || { why="createdb failed: $(tail -n 1 "$cluster/createdb.log")"; return 1; }
}

why=""
if ! start_server; then
  cleanup
  run_without "$why" "$@"
  exit $?
fi

export PERFMODEL_TEST_POSTGRES_URL="postgresql+psycopg://$DB_USER@/$DB_NAME?host=$cluster"
# What a test needs to stop, start or make another server like this one (tests/service/test_faults.py): the data
# folder (owned by the user the server runs as) and the pg_ctl that runs it (initdb and postgres beside it).
export PERFMODEL_TEST_POSTGRES_DATA="$cluster/data"
export PERFMODEL_TEST_POSTGRES_CTL="$bindir/pg_ctl"
unset PERFMODEL_TEST_POSTGRES_SKIP_REASON
say "PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on $cluster; PERFMODEL_TEST_POSTGRES_URL=$PERFMODEL_TEST_POSTGRES_URL"
"$@"
exit $?
