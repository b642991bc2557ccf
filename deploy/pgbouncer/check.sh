#!/usr/bin/env bash
# Runs deploy/pgbouncer/pgbouncer.ini on a real PgBouncer in front of a throwaway PostgreSQL:
#   1. every setting docs/pgbouncer.md asks for (its ```ini block) is in the file's [pgbouncer]
#      section with the same value, and PgBouncer reports that value (SHOW CONFIG)
#   2. a temporary copy of the file is changed only where it names an address or a file of this
#      machine — listen_addr, listen_port, auth_file, and host=/port= of each [databases] entry —
#      and the script checks that no other line differs
#   3. PgBouncer starts on that copy; SHOW DATABASES on the admin console lists each pool with the
#      pool_mode and pool_size the file gives it: the state database in transaction mode, the same
#      database in session mode, the application database with a pool no larger than
#      default_pool_size
#   4. a query runs through every pool as deprov runs its statements (BEGIN; SET LOCAL ...;
#      SELECT ...; COMMIT in one simple-protocol message, no prepared statement) and reaches the
#      database the entry names
#   5. a client LISTENing through the session pool (as DEPROV_NOTIFY_URL) and idle receives a
#      NOTIFY another client sends through the transaction pool (as intake does)
#   6. a startup packet with extra_float_digits (sent by sqlx) is accepted, and one with `options`
#      is refused, as docs/pgbouncer.md says
# The roles are the users of userlist.txt.example, with throwaway passwords; PostgreSQL trusts
# connections from 127.0.0.1 only. Everything runs in a temporary directory, on free ports, and is
# stopped and removed on exit.
#
# Needs: pgbouncer (Debian package `pgbouncer`; or DEPROV_PGBOUNCER), PostgreSQL server binaries
# (DEPROV_PG_BIN, default the newest /usr/lib/postgresql/*/bin), psql, python3; as root, runuser
# and a `postgres` user (PostgreSQL and PgBouncer refuse to run as root).
set -euo pipefail
cd "$(dirname "$0")/../.."

ini=deploy/pgbouncer/pgbouncer.ini
userlist_example=deploy/pgbouncer/userlist.txt.example
docs=docs/pgbouncer.md
pgbouncer_bin=${DEPROV_PGBOUNCER:-/usr/sbin/pgbouncer}
if [ -z "${DEPROV_PG_BIN:-}" ]; then
  DEPROV_PG_BIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin 2>/dev/null | sort -V | tail -n 1)
fi
pg_bin=${DEPROV_PG_BIN:-}

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
die() {
  echo "FAIL: $*" >&2
  exit 1
}

[ -x "$pgbouncer_bin" ] || die "$pgbouncer_bin not found (Debian: apt-get install pgbouncer)"
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ] || [ ! -x "$pg_bin/pg_ctl" ]; then
  die "PostgreSQL server binaries not found (set DEPROV_PG_BIN; Debian: apt-get install postgresql)"
fi
command -v psql >/dev/null 2>&1 || die "psql not found (Debian: apt-get install postgresql-client)"
command -v python3 >/dev/null 2>&1 || die "python3 not found"

if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || die "running as root needs a postgres user (the postgresql package creates it)"
  as_pg() { runuser -u postgres -- "$@"; }
else
  as_pg() { "$@"; }
fi

tmp=$(mktemp -d /tmp/deprov-pgbouncer-check.XXXXXX)
pg_started=0
bouncer_pid=
listener_pid=
cleanup() {
  local status=$?
  if [ -n "$listener_pid" ]; then
    kill "$listener_pid" 2>/dev/null || true
  fi
  if [ -n "$bouncer_pid" ]; then
    if [ -s "$tmp/pgbouncer.pid" ]; then
      kill -TERM "$(cat "$tmp/pgbouncer.pid")" 2>/dev/null || true
    else
      kill -TERM "$bouncer_pid" 2>/dev/null || true
    fi
    wait "$bouncer_pid" 2>/dev/null || true
  fi
  if [ "$pg_started" -eq 1 ]; then
    as_pg "$pg_bin/pg_ctl" -D "$tmp/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ "$status" -ne 0 ]; then
    for log in "$tmp/pgbouncer.log" "$tmp/postgres.log"; do
      if [ -s "$log" ]; then
        echo "--- last lines of $(basename "$log")" >&2
        tail -n 20 "$log" >&2
      fi
    done
  fi
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ "$(id -u)" -eq 0 ]; then
  chown postgres: "$tmp"
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# "key value" of the [pgbouncer] section, comments and blanks removed.
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

echo "== settings of $docs in $ini"
required=$(awk '
  /^```ini/ { in_block = 1; next }
  /^```/ { in_block = 0 }
  in_block && /=/ {
    sub(/;.*/, "")
    key = $0; sub(/=.*/, "", key); gsub(/[[:space:]]/, "", key)
    value = $0; sub(/^[^=]*=/, "", value); gsub(/^[[:space:]]+|[[:space:]]+$/, "", value)
    print key, value
  }
' "$docs")
[ -n "$required" ] || die "no \`\`\`ini block with settings found in $docs"
configured=$(pgbouncer_section "$ini")
while read -r key value; do
  have=$(awk -v k="$key" '$1 == k { $1 = ""; sub(/^ /, ""); print }' <<<"$configured")
  if [ "$have" = "$value" ]; then
    echo "ok   $key = $value"
  else
    fail "$ini: $key is '${have:-<unset>}', $docs asks for '$value'"
  fi
done <<<"$required"

echo "== throwaway PostgreSQL ($pg_bin)"
pg_port=$(free_port)
as_pg "$pg_bin/initdb" -D "$tmp/data" -U postgres -A trust -E UTF8 >"$tmp/initdb.log" 2>&1 ||
  { cat "$tmp/initdb.log" >&2; die "initdb failed"; }
printf '%s\n' 'local all all trust' 'host all all 127.0.0.1/32 trust' >"$tmp/data/pg_hba.conf"
pg_started=1
as_pg "$pg_bin/pg_ctl" -D "$tmp/data" -l "$tmp/postgres.log" -w -t 30 \
  -o "-c listen_addresses=127.0.0.1 -c port=$pg_port -c unix_socket_directories=$tmp" start >/dev/null
pg() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U postgres "$@"; }

# The pools: "alias dbname pool_mode pool_size" ("-" when the entry leaves it to [pgbouncer]).
entries=$(awk '
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
' "$ini")
[ -n "$entries" ] || die "no [databases] entries in $ini"
users=$(sed -nE 's/^"([^"]+)".*/\1/p' "$userlist_example")
[ -n "$users" ] || die "no users in $userlist_example"
: >"$tmp/userlist.txt"
for user in $users; do
  pg -c "CREATE ROLE \"$user\" LOGIN"
  printf '"%s" "check-%s"\n' "$user" "$user" >>"$tmp/userlist.txt"
done
while read -r dbname; do
  pg -c "CREATE DATABASE \"$dbname\""
done < <(awk '{ print $2 }' <<<"$entries" | sort -u)
echo "PostgreSQL on 127.0.0.1:$pg_port; roles: $(paste -sd ' ' <<<"$users"); databases: $(awk '{ print $2 }' <<<"$entries" | sort -u | paste -sd ' ')"

echo "== $ini on a copy with this machine's addresses"
bouncer_port=$(free_port)
copy=$tmp/pgbouncer.ini
sed -E \
  -e "s|^listen_addr[[:space:]]*=.*|listen_addr = 127.0.0.1|" \
  -e "s|^listen_port[[:space:]]*=.*|listen_port = $bouncer_port|" \
  -e "s|^auth_file[[:space:]]*=.*|auth_file = $tmp/userlist.txt|" \
  -e "/^\[databases\]/,/^\[/ s/(^|[[:space:]])host=[^[:space:]]+/\1host=127.0.0.1/" \
  -e "/^\[databases\]/,/^\[/ s/(^|[[:space:]])port=[0-9]+/\1port=$pg_port/" \
  "$ini" >"$copy"
changed=0
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
done 3<"$ini" 4<"$copy"
[ "$(wc -l <"$ini")" -eq "$(wc -l <"$copy")" ] || fail "the copy has a different number of lines"
while read -r alias _; do
  line=$(grep -E "^${alias}[[:space:]]*=" "$copy")
  [[ $line == *" host=127.0.0.1 "* && $line == *" port=$pg_port "* ]] ||
    fail "the copy's entry $alias does not point at the throwaway PostgreSQL: $line"
done <<<"$entries"
echo "$changed lines rewritten (listen_addr, listen_port, auth_file, host= and port= of each pool); no other line differs"
chmod 0644 "$copy" "$tmp/userlist.txt"

# PgBouncer in the foreground, as the postgres user; its pid is written before the exec.
# shellcheck disable=SC2016 # expanded by the inner sh
as_pg sh -c 'echo $$ >"$1"; exec "$2" "$3"' sh "$tmp/pgbouncer.pid" "$pgbouncer_bin" "$copy" \
  >"$tmp/pgbouncer.log" 2>&1 &
bouncer_pid=$!
for _ in $(seq 1 100); do
  if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' \
    "$bouncer_port" 2>/dev/null; then
    break
  fi
  kill -0 "$bouncer_pid" 2>/dev/null || die "PgBouncer exited at start"
  sleep 0.1
done
echo "PgBouncer $("$pgbouncer_bin" --version | awk 'NR == 1 { print $2 }') on 127.0.0.1:$bouncer_port"

# Through PgBouncer: `through USER DATABASE psql-args...`, password from the throwaway userlist.
through() {
  local user=$1 database=$2
  shift 2
  PGPASSWORD="check-$user" PGCONNECT_TIMEOUT=5 psql -X -q -v ON_ERROR_STOP=1 \
    -h 127.0.0.1 -p "$bouncer_port" -U "$user" -d "$database" "$@"
}
admin_user=$(pgbouncer_section "$ini" | awk '$1 == "admin_users" { sub(/,.*/, "", $2); print $2 }')
[ -n "$admin_user" ] || die "$ini sets no admin_users"
# `admin 'SHOW ...'`: the admin console's rows, one a line, as tab-separated "column=value".
admin() {
  through "$admin_user" pgbouncer -A -F '|' -P footer=off -c "$1" | awk -F '|' '
    NR == 1 { for (i = 1; i <= NF; i++) name[i] = $i; next }
    { line = name[1] "=" $1; for (i = 2; i <= NF; i++) line = line "\t" name[i] "=" $i; print line }
  '
}
# `row COLUMN VALUE <rows`: the rows whose COLUMN is VALUE; `field COLUMN <row`: its value.
row() { awk -F '\t' -v want="$1=$2" '{ for (i = 1; i <= NF; i++) if ($i == want) { print; next } }'; }
field() {
  awk -F '\t' -v col="$1" '{
    for (i = 1; i <= NF; i++) if (index($i, col "=") == 1) { print substr($i, length(col) + 2); exit }
  }'
}

echo "== SHOW CONFIG"
config=$(admin 'SHOW CONFIG')
while read -r key value; do
  have=$(row key "$key" <<<"$config" | field value)
  if [ "$have" = "$value" ]; then
    echo "ok   $key = $have"
  else
    fail "PgBouncer reports $key = '$have', $docs asks for '$value'"
  fi
done <<<"$required"

echo "== SHOW DATABASES"
global_mode=$(pgbouncer_section "$ini" | awk '$1 == "pool_mode" { print $2 }')
default_size=$(pgbouncer_section "$ini" | awk '$1 == "default_pool_size" { print $2 }')
databases=$(admin 'SHOW DATABASES')
while read -r alias dbname mode size; do
  pool=$(row name "$alias" <<<"$databases")
  if [ -z "$pool" ]; then
    fail "PgBouncer does not list the pool $alias"
    continue
  fi
  want_mode=$mode
  [ "$want_mode" = "-" ] && want_mode=$global_mode
  want_size=$size
  [ "$want_size" = "-" ] && want_size=$default_size
  have_mode=$(field pool_mode <<<"$pool")
  have_size=$(field pool_size <<<"$pool")
  have_db=$(field database <<<"$pool")
  # An empty pool_mode: the entry inherits [pgbouncer] pool_mode.
  [ -n "$have_mode" ] || have_mode="$(row key pool_mode <<<"$config" | field value) (inherited)"
  want_mode_shown=$want_mode
  [ "$mode" = "-" ] && want_mode_shown="$want_mode (inherited)"
  if [ "$have_mode" = "$want_mode_shown" ] && [ "$have_size" = "$want_size" ] && [ "$have_db" = "$dbname" ]; then
    echo "ok   $alias -> $have_db: pool_mode $have_mode, pool_size $have_size"
  else
    fail "$alias: PgBouncer has database=$have_db pool_mode=$have_mode pool_size=$have_size, $ini gives $dbname $want_mode $want_size"
  fi
done <<<"$entries"

# What deprov needs of the pools (docs/pgbouncer.md).
mode_of() { awk -v a="$1" -v g="$global_mode" '$1 == a { print ($3 == "-" ? g : $3) }' <<<"$entries"; }
size_of() { awk -v a="$1" -v d="$default_size" '$1 == a { print ($4 == "-" ? d : $4) }' <<<"$entries"; }
db_of() { awk -v a="$1" '$1 == a { print $2 }' <<<"$entries"; }
state_db=$(db_of deprov)
[ "$(mode_of deprov)" = transaction ] || fail "the state pool deprov is not in transaction mode"
[ "$(mode_of deprov_session)" = session ] || fail "the pool deprov_session is not in session mode"
if [ -z "$state_db" ] || [ "$(db_of deprov_session)" != "$state_db" ]; then
  fail "deprov_session does not reach the state database ($state_db)"
fi
[ "$(mode_of app)" = transaction ] || fail "the target pool app is not in transaction mode"
[ "$(size_of app)" -le "$default_size" ] || fail "the target pool app is larger than default_pool_size"

echo "== a query through every pool"
# One simple-protocol message, as deprov opens every transaction (docs/configuration.md).
transaction="BEGIN; SET LOCAL lock_timeout = '1s'; SET LOCAL statement_timeout = '5s'; SELECT current_database(); COMMIT;"
while read -r alias dbname _ _; do
  user=deprov
  [ "$alias" = app ] && user=deprov_target
  got=$(through "$user" "$alias" -At -v SHOW_ALL_RESULTS=on -c "$transaction" 2>&1) || {
    fail "$alias: the query failed: $got"
    continue
  }
  got=$(grep -vE '^(BEGIN|SET|COMMIT)$' <<<"$got")
  if [ "$got" = "$dbname" ]; then
    echo "ok   $alias (as $user): current_database() = $got"
  else
    fail "$alias: current_database() is '$got', expected $dbname"
  fi
done <<<"$entries"

echo "== SHOW POOLS (the pools those queries used)"
pools=$(admin 'SHOW POOLS')
while read -r alias _; do
  used=$(row database "$alias" <<<"$pools")
  if [ -z "$used" ]; then
    fail "SHOW POOLS lists no pool of $alias"
    continue
  fi
  have_mode=$(field pool_mode <<<"$used")
  if [ "$have_mode" = "$(mode_of "$alias")" ]; then
    echo "ok   $alias/$(field user <<<"$used"): pool_mode $have_mode"
  else
    fail "$alias: SHOW POOLS says pool_mode $have_mode, expected $(mode_of "$alias")"
  fi
done <<<"$entries"

echo "== LISTEN through the session pool, NOTIFY through the transaction pool"
# As a worker's DEPROV_NOTIFY_URL connection and intake: the listener stays connected and idle while
# another client notifies; only a session keeps the listener's server for it between transactions.
mkfifo "$tmp/listener.in"
through deprov deprov_session <"$tmp/listener.in" >"$tmp/listener.out" 2>&1 &
listener_pid=$!
exec 5>"$tmp/listener.in"
printf '%s\n' 'LISTEN deprov_check;' '\echo listening' >&5
for _ in $(seq 1 100); do
  grep -q '^listening$' "$tmp/listener.out" && break
  sleep 0.1
done
through deprov deprov -c 'NOTIFY deprov_check' || fail "NOTIFY through the pool deprov failed"
sleep 0.5
printf '%s\n' 'SELECT 1;' '\q' >&5
exec 5>&-
for _ in $(seq 1 100); do
  kill -0 "$listener_pid" 2>/dev/null || break
  sleep 0.1
done
wait "$listener_pid" || fail "the listening client failed: $(cat "$tmp/listener.out")"
listener_pid=
if grep -q 'notification "deprov_check" received' "$tmp/listener.out"; then
  echo "ok   deprov_session: the idle listener received the NOTIFY sent through deprov"
else
  fail "deprov_session: the listener received no notification: $(cat "$tmp/listener.out")"
fi

echo "== startup parameters"
# Sends a StartupMessage with the given parameters; prints PgBouncer's first answer: "R" (it goes
# on to authentication) or "E <message>".
startup() {
  python3 - "$bouncer_port" "$@" <<'PY'
import socket
import struct
import sys

port, pairs = int(sys.argv[1]), sys.argv[2:]
payload = struct.pack("!I", 196608)
for pair in pairs:
    key, value = pair.split("=", 1)
    payload += key.encode() + b"\0" + value.encode() + b"\0"
payload += b"\0"
with socket.create_connection(("127.0.0.1", port), 5) as s:
    s.sendall(struct.pack("!I", len(payload) + 4) + payload)
    kind = s.recv(1)
    if kind == b"E":
        length = struct.unpack("!I", s.recv(4))[0]
        body = b""
        while len(body) < length - 4:
            body += s.recv(length - 4 - len(body))
        fields = {f[:1]: f[1:].decode() for f in body.split(b"\0") if f}
        print("E", fields.get(b"M", ""))
    else:
        print(kind.decode())
PY
}
answer=$(startup user=deprov database=deprov extra_float_digits=2 application_name=deprov-intake)
if [ "$answer" = R ]; then
  echo "ok   extra_float_digits and application_name accepted"
else
  fail "a startup packet with extra_float_digits was refused: $answer"
fi
answer=$(startup user=deprov database=deprov "options=-c statement_timeout=5s")
if [[ $answer == E* ]]; then
  echo "ok   options refused: ${answer#E }"
else
  fail "a startup packet with options was accepted ($answer): docs/pgbouncer.md says PgBouncer refuses it"
fi

if [ "$failures" -gt 0 ]; then
  echo "deploy/pgbouncer: $failures check(s) failed" >&2
  exit 1
fi
echo "deploy/pgbouncer: $(wc -l <<<"$required") required settings, $(wc -l <<<"$entries") pools: all checks passed"
