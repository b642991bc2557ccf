#!/usr/bin/env bash
# A local rehearsal of the deployment deploy/ describes, on this machine:
#   1. a throwaway PostgreSQL with the roles of deploy/pgbouncer/userlist.txt.example, the state
#      database `deprov` (owned by `deprov`) and the application database `app` (owned by
#      `deprov_target`) holding the demo schema (crates/deprov-demo/src/schema.sql) and three accounts made by the
#      demo's generators (crates/deprov-demo/src/data.sql)
#   2. PgBouncer on deploy/pgbouncer/pgbouncer.ini, changed only in its addresses and auth_file
#   3. the migration Job (twice, as at an upgrade), one API process (deprov-api) and two workers
#      (deprov-worker), each run
#      with the command, arguments and environment deploy/kubernetes gives it (check_manifests.py
#      run-spec), the Secrets filled with URLs through PgBouncer and throwaway tokens; only the
#      listen addresses and the configuration file's path (deploy/kubernetes/deprov.toml) are this
#      machine's
#   4. `deprov kill-switch on --wait`: both workers acknowledge; a deletion request for account 1
#      is recorded `held`; `kill-switch off`: a worker runs it to `completed`
#   5. the application database equals a copy taken before the run on which the cascading
#      `DELETE FROM app.accounts WHERE id = 1` ran (every table's rows, by md5); accounts 2 and 3
#      keep every row
#   6. `promtool check metrics` on the API's and both workers' live /metrics
#   7. no process logged a warning or an error
# Prints each step's result; exits non-zero on the first failure, showing the processes' logs.
#
#   deploy/rehearse.sh [BINARY]     BINARY defaults to target/release/deprov
#
# Needs: what deploy/lib/stack.sh needs, curl, promtool (Debian package `prometheus`), and the venv
# of `deploy/check.sh --install` (PyYAML, for check_manifests.py).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(realpath "${1:-target/release/deprov}")
[ -x "$bin" ] || { echo "FAIL: $bin: no binary (cargo build --release, or pass one)" >&2; exit 1; }
py=${DEPROV_KV_VENV:-/opt/deprov-kv}/bin/python
stack_dir=$(mktemp -d /tmp/deprov-rehearsal.XXXXXX)
# shellcheck source=deploy/lib/stack.sh
. deploy/lib/stack.sh
tmp=$stack_dir
pids=()
cleanup() {
  local status=$? pid log
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  if [ "$status" -ne 0 ]; then
    for log in "$tmp"/*.deprov.log; do
      [ -s "$log" ] || continue
      echo "--- last lines of $(basename "$log")" >&2
      tail -n 15 "$log" >&2
    done
  fi
  stack_exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
stack_tools
for tool in curl promtool "$py"; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool not found"
done

echo "== PostgreSQL and PgBouncer"
stack_postgres
stack_roles_databases
pg -c 'ALTER DATABASE deprov OWNER TO deprov' -c 'ALTER DATABASE app OWNER TO deprov_target'
as_target() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$pg_port" -U deprov_target -d app "$@"; }
as_target -f crates/deprov-demo/src/schema.sql
# The demo's generators, for accounts 1-3 (crates/deprov-demo/src/data.sql: $1 the accounts, $2 their shape;
# the cross-tenant links are left out).
"$py" - crates/deprov-demo/src/data.sql >"$tmp/data.sql" <<'PY'
import json, re, sys

shape = dict(users=5, api_keys=2, projects=4, members_stride=2, env_vars=3, builds_per_project=2,
             deployments_per_env=3, events_per_deployment=5, log_lines_per_deployment=100,
             checks_per_deployment=2, annotations_per_check=2, env_var_versions=2,
             artifacts_per_deployment=2, webhooks_per_project=1, deliveries_per_webhook=5, folders=7,
             documents_per_folder=3, links_per_project=1, audit_events=50, invoices=3,
             lines_per_invoice=3, cross_links=0)
parts = re.split(r"^-- @(insert|exec|cross)\b[^\n]*\n", open(sys.argv[1]).read(), flags=re.M)
for kind, body in zip(parts[1::2], parts[2::2]):
    if kind == "cross":
        continue
    sql = "\n".join(l for l in body.splitlines() if not l.startswith("--")).strip().rstrip(";")
    print(f"PREPARE gen(bigint[], jsonb, bigint[]) AS {sql};")
    print(f"EXECUTE gen('{{1,2,3}}', '{json.dumps(shape)}', '{{}}');")
    print("DEALLOCATE gen;")
PY
as_target -f "$tmp/data.sql"
rows() { as_target -At -c "SELECT count(*) FROM $1"; }
echo "app: demo schema, accounts $(as_target -At -c 'SELECT string_agg(id::text, $$,$$ ORDER BY id) FROM app.accounts'), $(as_target -At -c "SELECT sum((xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM %I.%I', schemaname, tablename), false, true, '')))[1]::text::bigint) FROM pg_tables WHERE schemaname = 'app'") rows"
# The reference: a copy of app on which the cascade runs.
pg -c 'CREATE DATABASE app_cascade TEMPLATE app'
pg -d app_cascade -c 'DELETE FROM app.accounts WHERE id = 1'
stack_ini_copy
stack_pgbouncer
[ "$failures" -eq 0 ] || die "the PgBouncer configuration copy"

echo "== deprov, as deploy/kubernetes runs it"
url() { echo "postgres://$1:check-$1@127.0.0.1:$bouncer_port/$2"; }
operator_token=rehearsal-operator-$RANDOM$RANDOM$RANDOM
billing_token=rehearsal-billing-$RANDOM$RANDOM$RANDOM
cat >"$tmp/secrets.json" <<JSON
{
  "deprov-database/state-url": "$(url deprov deprov)",
  "deprov-database/state-session-url": "$(url deprov deprov_session)",
  "deprov-database/target-url": "$(url deprov_target app)",
  "deprov-tokens/operator-token": "$operator_token",
  "deprov-tokens/billing-token": "$billing_token",
  "deprov-tokens/vercel-token": "rehearsal-vercel-$RANDOM$RANDOM$RANDOM"
}
JSON
# `start NAME KIND/NAME [--set VAR=VALUE]...`: runs the workload's command with exactly its
# environment (env -i), `deprov` being BINARY; in the background unless NAME starts with "migrate".
start() {
  local name=$1 workload=$2 word var
  shift 2
  local argv=() envv=()
  "$py" deploy/kubernetes/check_manifests.py run-spec --base deploy/kubernetes \
    --secrets "$tmp/secrets.json" "$@" "$workload" >"$tmp/$name.spec"
  while IFS= read -r line; do
    case $line in
      "ARG "*) word=${line#ARG }; [ "$word" = deprov ] && word=$bin; argv+=("$word") ;;
      "ENV "*) var=${line#ENV }; envv+=("$var") ;;
    esac
  done <"$tmp/$name.spec"
  echo "$name: ${argv[*]:1} (${#envv[@]} variables from $workload)"
  if [[ $name == migrate* ]]; then
    env -i "${envv[@]}" "${argv[@]}" >"$tmp/$name.deprov.log" 2>&1 || die "the migration Job failed"
  else
    env -i "${envv[@]}" "${argv[@]}" >"$tmp/$name.deprov.log" 2>&1 &
    pids+=("$!")
  fi
}
config=$PWD/deploy/kubernetes/deprov.toml
api_port=$(free_port)
metrics_1=$(free_port)
metrics_2=$(free_port)
start migrate Job/deprov-migrate
# The Job again, as at an upgrade: nothing pending, nothing replayed.
start migrate-again Job/deprov-migrate
start api Deployment/deprov-api --set DEPROV_CONFIG="$config" --set DEPROV_LISTEN="127.0.0.1:$api_port"
start worker-1 Deployment/deprov-worker --set DEPROV_CONFIG="$config" --set DEPROV_METRICS_LISTEN="127.0.0.1:$metrics_1"
start worker-2 Deployment/deprov-worker --set DEPROV_CONFIG="$config" --set DEPROV_METRICS_LISTEN="127.0.0.1:$metrics_2"

# `ready URL`: waits up to 30 s for a 200 (the probes of the manifests).
ready() {
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  die "$1 did not answer 200 within 30 s"
}
api=http://127.0.0.1:$api_port
ready "$api/readyz"
ready "http://127.0.0.1:$metrics_1/healthz"
ready "http://127.0.0.1:$metrics_2/healthz"
echo "ok   api /readyz, worker-1 and worker-2 /healthz: 200"
# Both workers registered as live (deprov.workers), so that the kill switch waits for both.
for _ in $(seq 1 100); do
  live=$(pg -d deprov -At -c 'SELECT count(*) FROM deprov.workers WHERE live_until > now()')
  [ "$live" -ge 2 ] && break
  sleep 0.1
done
[ "$live" -ge 2 ] || die "$live live worker(s) in deprov.workers after 10 s, expected 2"
echo "ok   2 live workers in deprov.workers"

# The operator's CLI, with the API's environment (its state URL through the transaction pool).
operator() {
  local envv=()
  mapfile -t envv < <(sed -n 's/^ENV //p' "$tmp/api.spec")
  env -i "${envv[@]}" "$bin" "$@"
}
job_field() { "$py" -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1], {}, d))' "$1"; }

echo "== kill switch, then a deletion request"
operator kill-switch on --reason "rehearsal" --wait --timeout 30s >"$tmp/kill-switch.out"
sed 's/^/  /' "$tmp/kill-switch.out"
grep -q 'acknowledged by all 2 live worker' "$tmp/kill-switch.out" ||
  die "the kill switch was not acknowledged by both workers"
answer=$(curl -fsS -X POST "$api/v1/deletion-requests" -H "Authorization: Bearer $billing_token" \
  -H 'Content-Type: application/json' \
  -d '{"tenant_id": "1", "external_id": "rehearsal-1", "reason": "uninstalled"}')
job=$(job_field job_id <<<"$answer")
state=$(job_field state <<<"$answer")
[ "$state" = held ] || die "the request was recorded '$state' under the kill switch, expected held: $answer"
echo "ok   POST /v1/deletion-requests: 202, job $job held"
operator kill-switch off --reason "rehearsal done" | sed 's/^/  /'

echo "== the job"
for _ in $(seq 1 600); do
  job_json=$(curl -fsS -H "Authorization: Bearer $operator_token" "$api/v1/jobs/$job")
  state=$(job_field state <<<"$job_json")
  case $state in completed | failed | cancelled) break ;; esac
  sleep 0.1
done
[ "$state" = completed ] || die "job $job ended '$state': $job_json"
job_field '"ok   job %s completed: %s rows deleted in %s batches, longest batch %.1f ms, attempts %s" % (job_id, progress["rows_deleted"], progress["batches"], progress["longest_batch_ms"], attempts)' <<<"$job_json"

echo "== app against the cascade's copy"
digest() {
  pg -d "$1" -At -c "
    SELECT format('SELECT %L, count(*), md5(coalesce(string_agg(t::text, %L ORDER BY t::text), %L)) FROM %I.%I t',
                  tablename, ',', '', schemaname, tablename) || ';'
    FROM pg_tables WHERE schemaname = 'app' ORDER BY tablename" |
    pg -d "$1" -At
}
digest app >"$tmp/deprov.digest"
digest app_cascade >"$tmp/cascade.digest"
if diff "$tmp/cascade.digest" "$tmp/deprov.digest" >&2; then
  echo "ok   $(wc -l <"$tmp/deprov.digest") tables equal to the cascade's (md5 of every row); accounts left: $(as_target -At -c 'SELECT string_agg(id::text, $$,$$ ORDER BY id) FROM app.accounts')"
else
  die "app differs from the cascade's copy (above: table|rows|md5, cascade then deprov)"
fi

echo "== promtool check metrics"
for target in "api $api/metrics" "worker-1 http://127.0.0.1:$metrics_1/metrics" \
  "worker-2 http://127.0.0.1:$metrics_2/metrics"; do
  read -r name metrics_url <<<"$target"
  curl -fsS "$metrics_url" >"$tmp/$name.metrics"
  if promtool check metrics <"$tmp/$name.metrics" >"$tmp/$name.promtool" 2>&1; then
    echo "ok   $name: $(grep -c '^# TYPE deprov_' "$tmp/$name.metrics") deprov metrics, promtool check metrics clean"
  else
    cat "$tmp/$name.promtool" >&2
    die "promtool check metrics on $name's /metrics"
  fi
done
# The worker that ran the job counted its rows.
counted=$(cat "$tmp/worker-1.metrics" "$tmp/worker-2.metrics" |
  awk '$1 == "deprov_rows_deleted_total" { s += $2 } END { print s + 0 }')
deleted=$(job_field 'progress["rows_deleted"]' <<<"$job_json")
[ "$counted" = "$deleted" ] || die "the workers' deprov_rows_deleted_total is $counted, the job deleted $deleted rows"
echo "ok   deprov_rows_deleted_total over both workers: $counted, the job's rows"
# A clean run logs no warning and no error in any process.
if grep -hE '"level":"(WARN|ERROR)"' "$tmp"/*.deprov.log >"$tmp/warnings"; then
  cat "$tmp/warnings" >&2
  die "the processes logged the warnings or errors above"
fi
echo "ok   no process logged a warning or an error"
echo "deploy/rehearse.sh: the deployment ran a deletion end to end"
