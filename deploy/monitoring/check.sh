#!/usr/bin/env bash
# Checks deploy/monitoring offline:
#   1. promtool check rules deploy/monitoring/alerts.yaml
#   2. promtool test rules deploy/monitoring/alerts.test.yaml
#   3. every alert has a runbook_url annotation of exactly deploy/runbooks/<AlertName>.md, that
#      file exists, and every runbook file belongs to an alert
#   4. every alert has a test case where it fires and one where it does not
#   5. every deprov metric used in alerts.yaml (and fed in by alerts.test.yaml) is defined in
#      crates/deprov/src/telemetry/mod.rs (a renamed metric fails here instead of leaving an alert that can
#      never fire)
#   6. every PromQL expression of the Grafana dashboard dashboard.json parses (promtool check rules
#      on a rule file made of them, Grafana's variables replaced by sample values), every variable
#      it uses is a template variable or one of Grafana's interval variables, and its deprov
#      metrics are defined in crates/deprov/src/telemetry/mod.rs (with step 5)
#   7. the YAML files pass yamllint (relaxed; alerts.yaml lines up to 100 characters), when
#      yamllint is installed
# Needs promtool (Debian package `prometheus`), python3, bash, awk, grep, sed, sort. Exits non-zero on any
# failure, after reporting all of them.
set -euo pipefail
cd "$(dirname "$0")/../.."

rules=deploy/monitoring/alerts.yaml
tests=deploy/monitoring/alerts.test.yaml
dashboard=deploy/monitoring/dashboard.json
runbooks=deploy/runbooks
telemetry=crates/deprov/src/telemetry/mod.rs

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

if ! command -v promtool >/dev/null 2>&1; then
  echo "FAIL: promtool not found (Debian: apt-get install prometheus)" >&2
  exit 1
fi

echo "== promtool check rules $rules"
promtool check rules "$rules" || fail "promtool check rules $rules"

echo "== the dashboard's expressions ($dashboard)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# A rule file with one recording rule per panel target, and the list of the expressions' variables
# that are neither template variables nor Grafana's own.
if python3 - "$dashboard" "$tmp/dashboard.rules.yaml" >"$tmp/dashboard.out" <<'PY'; then
import json, re, sys

board = json.load(open(sys.argv[1]))
defined = {v["name"] for v in board["templating"]["list"]}
builtin = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
samples = {"job": "deprov"}
panels = [p for p in board["panels"]] + [c for p in board["panels"] for c in p.get("panels", [])]
rules, unknown = [], set()
for panel in panels:
    for target in panel.get("targets", []):
        expr = target["expr"]
        def sub(m):
            name = m.group(1) or m.group(2)
            if name in builtin:
                return builtin[name]
            if name not in defined:
                unknown.add(name)
            return samples.get(name, "x")
        expr = re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, expr)
        rules.append((panel["title"], target["refId"], expr))
with open(sys.argv[2], "w") as out:
    out.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (_, _, expr) in enumerate(rules):
        out.write(f"      - record: dashboard:target_{i}\n        expr: {json.dumps(expr)}\n")
for name in sorted(unknown):
    print(f"unknown variable ${name}")
for title, ref, expr in rules:
    print(f"expr {expr}")
PY
  if grep '^unknown variable' "$tmp/dashboard.out" >&2; then
    fail "$dashboard uses variables it does not define"
  fi
  if promtool check rules "$tmp/dashboard.rules.yaml" >"$tmp/promtool.out" 2>&1; then
    echo "ok   promtool parsed the $(grep -c '^expr ' "$tmp/dashboard.out") expressions of $dashboard"
  else
    cat "$tmp/promtool.out" >&2
    fail "promtool check rules on $dashboard's expressions"
  fi
else
  fail "$dashboard: not a Grafana dashboard this check can read"
fi

echo "== promtool test rules $tests"
promtool test rules "$tests" || fail "promtool test rules $tests"

# Alert names with their runbook_url, one "<alert> <url>" line each ("<alert> -" when missing).
# Relies on the file's layout: `- alert: Name` starts a rule, `runbook_url: value` inside it.
alert_urls=$(awk '
  function flush() { if (alert != "") print alert, (url == "" ? "-" : url) }
  /^[[:space:]]*-[[:space:]]*(alert|record):/ {
    flush(); alert = ""; url = ""
    if ($2 == "alert:") alert = $3
    next
  }
  /^[[:space:]]*runbook_url:/ { url = $2; gsub(/["'\'']/, "", url) }
  END { flush() }
' "$rules")

if [ -z "$alert_urls" ]; then
  fail "no alerts found in $rules"
fi

alerts=()
while read -r alert url; do
  [ -n "$alert" ] || continue
  alerts+=("$alert")
  want="$runbooks/$alert.md"
  if [ "$url" = "-" ]; then
    fail "$alert: no runbook_url annotation"
  elif [ "$url" != "$want" ]; then
    fail "$alert: runbook_url is $url, expected $want"
  fi
  [ -f "$want" ] || fail "$alert: runbook $want does not exist"
done <<<"$alert_urls"

dupes=$(printf '%s\n' "${alerts[@]}" | sort | uniq -d)
[ -z "$dupes" ] || fail "alert names used twice: $dupes"

# Looked up in a here-string, not a pipe: under pipefail, `grep -q` leaving early would fail the
# pipeline with printf's SIGPIPE and report a listed alert as missing.
alert_list=$(printf '%s\n' "${alerts[@]}")

echo "== runbooks"
for file in "$runbooks"/*.md; do
  [ -e "$file" ] || continue
  name=$(basename "$file" .md)
  grep -qxF "$name" <<<"$alert_list" || fail "$file: no alert named $name"
  for heading in Meaning Impact Diagnosis Mitigation; do
    grep -qE "^#+[[:space:]]+$heading\b" "$file" || fail "$file: no \"$heading\" section"
  done
done

echo "== test coverage"
# "<alert> fires" / "<alert> quiet" for every alert_rule_test case.
cases=$(awk '
  /^[[:space:]]*-[[:space:]]*alertname:/ { alert = $3; next }
  /^[[:space:]]*exp_alerts:[[:space:]]*\[\][[:space:]]*$/ { if (alert != "") print alert, "quiet"; alert = ""; next }
  /^[[:space:]]*exp_alerts:[[:space:]]*$/ { if (alert != "") print alert, "fires"; alert = ""; next }
' "$tests")
for alert in "${alerts[@]}"; do
  grep -qxF "$alert fires" <<<"$cases" || fail "$alert: no test case in $tests where it fires"
  grep -qxF "$alert quiet" <<<"$cases" || fail "$alert: no test case in $tests where it does not fire"
done
while read -r alert _; do
  [ -n "$alert" ] || continue
  grep -qxF "$alert" <<<"$alert_list" || fail "$tests tests an unknown alert $alert"
done <<<"$cases"

echo "== metric names against $telemetry"
# Every deprov_* name in the rule expressions (the `expr:` values, one-line or block).
metrics=$(awk '
  /^[[:space:]]*expr:/ {
    indent = match($0, /[^[:space:]]/); in_expr = 1
    sub(/^[[:space:]]*expr:[[:space:]]*[|>]?-?/, ""); print; next
  }
  in_expr {
    if ($0 ~ /^[[:space:]]*$/) next
    if (match($0, /[^[:space:]]/) <= indent) { in_expr = 0; next }
    print
  }
' "$rules" | grep -oE '\bdeprov_[a-z0-9_]+' | sort -u || true)
if [ -z "$metrics" ]; then
  fail "no deprov metric found in the expressions of $rules"
fi
# And the series the tests feed in: the tests must use only metrics deprov exports.
test_metrics=$(sed -nE "s/^[[:space:]]*-[[:space:]]*series:[[:space:]]*['\"]?(deprov_[a-z0-9_]+).*/\1/p" "$tests" |
  sort -u)
dashboard_metrics=$(sed -n 's/^expr //p' "$tmp/dashboard.out" | grep -oE '\bdeprov_[a-z0-9_]+' | sort -u || true)
[ -n "$dashboard_metrics" ] || fail "no deprov metric found in $dashboard"
metrics=$(printf '%s\n%s\n%s\n' "$metrics" "$test_metrics" "$dashboard_metrics" | sed '/^$/d' | sort -u)
checked=0
for metric in $metrics; do
  checked=$((checked + 1))
  if grep -qF "\"$metric\"" "$telemetry"; then
    continue
  fi
  # Histogram series: <name>_bucket, <name>_sum, <name>_count of a constant described as a
  # histogram.
  base=$(sed -E 's/_(bucket|sum|count)$//' <<<"$metric")
  if [ "$base" != "$metric" ]; then
    const=$(sed -nE "s/^pub const ([A-Z0-9_]+): &str = \"$base\";.*/\1/p" "$telemetry")
    if [ -n "$const" ] && tr '\n' ' ' <"$telemetry" |
      grep -qE "describe_histogram!\([[:space:]]*${const}[[:space:]]*,"; then
      continue
    fi
  fi
  fail "$metric (used in $rules, $tests or $dashboard) is not defined in $telemetry"
done

echo "== yamllint"
if command -v yamllint >/dev/null 2>&1; then
  # Strict (warnings fail); the test file's series selectors are long by nature.
  yamllint -s -d '{extends: relaxed, rules: {line-length: {max: 100}}}' "$rules" ||
    fail "yamllint $rules"
  yamllint -s -d '{extends: relaxed, rules: {line-length: disable}}' "$tests" ||
    fail "yamllint $tests"
else
  echo "yamllint not installed: skipped"
fi

if [ "$failures" -gt 0 ]; then
  echo "deploy/monitoring: $failures check(s) failed" >&2
  exit 1
fi
echo "deploy/monitoring: ${#alerts[@]} alerts, $(wc -l <<<"$cases") alert test cases, $checked metric names, $(find "$runbooks" -name '*.md' | wc -l) runbooks: all checks passed"
