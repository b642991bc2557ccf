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
docs=docs/pgbouncer.md
stack_dir=$(mktemp -d /tmp/deprov-pgbouncer-check.XXXXXX)
# shellcheck source=deploy/lib/stack.sh
. deploy/lib/stack.sh
tmp=$stack_dir
listener_pid=
cleanup() {
  local status=$?
  if [ -n "$listener_pid" ]; then
    kill "$listener_pid" 2>/dev/null || true
  fi
  stack_exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
stack_tools

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
stack_postgres
entries=$(stack_entries)
[ -n "$entries" ] || die "no [databases] entries in $ini"
stack_roles_databases

echo "== $ini on a copy with this machine's addresses"
stack_ini_copy
stack_pgbouncer

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
