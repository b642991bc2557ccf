# shellcheck shell=bash
# A throwaway PostgreSQL and a PgBouncer running deploy/pgbouncer/pgbouncer.ini, for the scripts of
# deploy/ that need real ones (deploy/pgbouncer/check.sh, deploy/rehearse.sh). Sourced, not run.
#
# The caller sets `stack_dir` (an empty directory) before sourcing it, then calls, in order:
#   stack_tools             finds the binaries (DEPROV_PG_BIN, DEPROV_PGBOUNCER) or dies
#   stack_postgres          initdb + start on a free port of 127.0.0.1 (sets pg_port); trusts
#                           127.0.0.1 only
#   stack_roles_databases   the users of userlist.txt.example as roles (password "check-<user>", also
#                           written to $stack_dir/userlist.txt) and the databases the ini's pools name
#   stack_ini_copy          $stack_dir/pgbouncer.ini: the ini with only listen_addr, listen_port,
#                           auth_file and each pool's host=/port= changed (sets bouncer_port)
#   stack_pgbouncer         PgBouncer on that copy, as the postgres user, until it accepts connections
# and `stack_exit STATUS` (or `stack_stop STATUS`) from its exit trap. `fail` counts a failure; `die` exits.
#
# Needs: pgbouncer, PostgreSQL server binaries, psql, python3; as root, runuser and a postgres user.

stack_dir=${stack_dir:?set stack_dir before sourcing deploy/lib/stack.sh}
stack_ini=deploy/pgbouncer/pgbouncer.ini
stack_userlist_example=deploy/pgbouncer/userlist.txt.example

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
die() {
  echo "FAIL: $*" >&2
  exit 1
}

stack_tools() {
  pgbouncer_bin=${DEPROV_PGBOUNCER:-/usr/sbin/pgbouncer}
  if [ -z "${DEPROV_PG_BIN:-}" ]; then
    DEPROV_PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
  fi
  pg_bin=${DEPROV_PG_BIN:-}
  [ -x "$pgbouncer_bin" ] || die "$pgbouncer_bin not found (Debian: apt-get install pgbouncer)"
  if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/pg_ctl" ]; then
    die "PostgreSQL server binaries not found (set DEPROV_PG_BIN; Debian: apt-get install postgresql)"
  fi
  command -v psql >/dev/null 2>&1 || die "psql not found (Debian: apt-get install postgresql-client)"
  command -v python3 >/dev/null 2>&1 || die "python3 not found"
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root needs a postgres user (the postgresql package creates it)"
    chown postgres: "$stack_dir"
  fi
}

# Runs a command as the postgres user when this script runs as root (PostgreSQL refuses root).
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits up to 10 s for 127.0.0.1:PORT to accept a connection while process PID lives.
wait_port() {
  local port=$1 pid=$2 what=$3
  for _ in $(seq 1 100); do
    if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' \
      "$port" 2>/dev/null; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || die "$what exited at start"
    sleep 0.1
  done
  die "$what does not accept connections on 127.0.0.1:$port"
}

# "key value" of the [pgbouncer] section of an ini file, comments and blanks removed.
pgbouncer_section() {
  awk '
    /^[[:space:]]*\[/ { in_section = ($0 ~ /^[[:space:]]*\[pgbouncer\]/); next }
    in_section {
      sub(/[;#].*/, "")
      if ($0 !~ /=/) next
      key = $0; sub(/=.*/, "", key); gsub(/[[:space:]]/, "", key)
      value = $0; sub(/^[^=]*=/, "", value); gsub(/^[[:space:]]+|[[:space:]]+$/, "", value)
      print key, value
    }
  ' "$1"
}

# The ini's pools, one "alias dbname pool_mode pool_size" line each ("-" when the entry leaves it to
# [pgbouncer]).
stack_entries() {
  awk '
    /^[[:space:]]*\[/ { in_section = ($0 ~ /^[[:space:]]*\[databases\]/); next }
    in_section && /=/ && $0 !~ /^[[:space:]]*[;#]/ {
      alias = $1; dbname = alias; mode = "-"; size = "-"
      for (i = 3; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "dbname") dbname = kv[2]
        if (kv[1] == "pool_mode") mode = kv[2]
        if (kv[1] == "pool_size") size = kv[2]
      }
      print alias, dbname, mode, size
    }
  ' "$stack_ini"
}

pg_started=0
bouncer_pid=
stack_postgres() {
  pg_port=$(free_port)
  as_pg "$pg_bin/initdb" -D "$stack_dir/data" -U postgres -A trust -E UTF8 >"$stack_dir/initdb.log" 2>&1 ||
    { cat "$stack_dir/initdb.log" >&2; die "initdb failed"; }
  printf '%s\n' 'local all all trust' 'host all all 127.0.0.1/32 trust' >"$stack_dir/data/pg_hba.conf"
  pg_started=1
  as_pg "$pg_bin/pg_ctl" -D "$stack_dir/data" -l "$stack_dir/postgres.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories=$stack_dir" start >/dev/null
}

# psql as the superuser on the throwaway server.
pg() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres "$@"; }

stack_roles_databases() {
  local users user dbname
  users=$(sed -nE 's/^"([^"]+)".*/\1/p' "$stack_userlist_example")
  [ -n "$users" ] || die "no users in $stack_userlist_example"
  : >"$stack_dir/userlist.txt"
  for user in $users; do
    pg -c "CREATE ROLE \"$user\" LOGIN"
    printf '"%s" "check-%s"\n' "$user" "$user" >>"$stack_dir/userlist.txt"
  done
  while read -r dbname; do
    pg -c "CREATE DATABASE \"$dbname\""
  done < <(stack_entries | awk '{ print $2 }' | sort -u)
  echo "PostgreSQL on 127.0.0.1:$pg_port; roles: $(paste -sd ' ' <<<"$users"); databases: $(stack_entries | awk '{ print $2 }' | sort -u | paste -sd ' ')"
}

stack_ini_copy() {
  local copy=$stack_dir/pgbouncer.ini changed=0 original rewritten normal normal_copy alias line
  bouncer_port=$(free_port)
  sed -E \
    -e "s|^listen_addr[[:space:]]*=.*|listen_addr = 127.0.0.1|" \
    -e "s|^listen_port[[:space:]]*=.*|listen_port = $bouncer_port|" \
    -e "s|^auth_file[[:space:]]*=.*|auth_file = $stack_dir/userlist.txt|" \
    -e "/^\[databases\]/,/^\[/ s/(^|[[:space:]])host=[^[:space:]]+/\1host=127.0.0.1/" \
    -e "/^\[databases\]/,/^\[/ s/(^|[[:space:]])port=[0-9]+/\1port=$pg_port/" \
    "$stack_ini" >"$copy"
  while IFS= read -r original <&3 && IFS= read -r rewritten <&4; do
    [ "$original" = "$rewritten" ] && continue
    changed=$((changed + 1))
    case $original in
      listen_addr* | listen_port* | auth_file*) ;;
      *)
        normal=$(sed -E 's/host=[^[:space:]]+/host=/; s/port=[0-9]+/port=/' <<<"$original")
        normal_copy=$(sed -E 's/host=[^[:space:]]+/host=/; s/port=[0-9]+/port=/' <<<"$rewritten")
        [ "$normal" = "$normal_copy" ] || fail "the copy changed more than an address: $original"
        ;;
    esac
  done 3<"$stack_ini" 4<"$copy"
  [ "$(wc -l <"$stack_ini")" -eq "$(wc -l <"$copy")" ] || fail "the copy has a different number of lines"
  while read -r alias _; do
    line=$(grep -E "^${alias}[[:space:]]*=" "$copy")
    [[ $line == *" host=127.0.0.1 "* && $line == *" port=$pg_port "* ]] ||
      fail "the copy's entry $alias does not point at the throwaway PostgreSQL: $line"
  done < <(stack_entries)
  echo "$changed lines rewritten (listen_addr, listen_port, auth_file, host= and port= of each pool); no other line differs"
  chmod 0644 "$copy" "$stack_dir/userlist.txt"
}

stack_pgbouncer() {
  # In the foreground, as the postgres user; its pid is written before the exec.
  # shellcheck disable=SC2016 # expanded by the inner sh
  as_pg sh -c 'echo $$ >"$1"; exec "$2" "$3"' sh "$stack_dir/pgbouncer.pid" "$pgbouncer_bin" \
    "$stack_dir/pgbouncer.ini" >"$stack_dir/pgbouncer.log" 2>&1 &
  bouncer_pid=$!
  wait_port "$bouncer_port" "$bouncer_pid" PgBouncer
  echo "PgBouncer $("$pgbouncer_bin" --version | awk 'NR == 1 { print $2 }') on 127.0.0.1:$bouncer_port"
}

# Stops PgBouncer and PostgreSQL; with a non-zero STATUS, shows the last lines of their logs.
stack_stop() {
  local status=$1 log
  if [ -n "$bouncer_pid" ]; then
    if [ -s "$stack_dir/pgbouncer.pid" ]; then
      kill -TERM "$(cat "$stack_dir/pgbouncer.pid")" 2>/dev/null || true
    else
      kill -TERM "$bouncer_pid" 2>/dev/null || true
    fi
    wait "$bouncer_pid" 2>/dev/null || true
  fi
  if [ "$pg_started" -eq 1 ]; then
    as_pg "$pg_bin/pg_ctl" -D "$stack_dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ "$status" -ne 0 ]; then
    for log in "$stack_dir/pgbouncer.log" "$stack_dir/postgres.log"; do
      if [ -s "$log" ]; then
        echo "--- last lines of $(basename "$log")" >&2
        tail -n 20 "$log" >&2
      fi
    done
  fi
}

# Ends the script with STATUS: stops the servers (stack_stop) and removes stack_dir.
stack_exit() {
  stack_stop "$1"
  rm -rf "$stack_dir"
  exit "$1"
}
