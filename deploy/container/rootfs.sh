#!/usr/bin/env bash
# Assembles the runtime root filesystem of deprov's container image (deploy/container/Containerfile)
# from a built binary:
#   DEST/usr/local/bin/deprov                the binary
#   DEST/lib*/..., DEST/usr/lib*/...         each shared object `ldd` names for it (the dynamic
#                                            loader, glibc, libgcc_s, libm), at the same path
#   DEST/etc/ssl/certs/ca-certificates.crt   the machine's CA bundle (Debian: ca-certificates)
#   DEST/etc/passwd, DEST/etc/group          root and the non-root user/group `nonroot` (65532)
#   DEST/etc/nsswitch.conf                   host names from /etc/hosts, then DNS
#   DEST/tmp                                 mode 1777
# Fails when ldd cannot find a library, the binary is not dynamically linked against the loader of
# this machine, or the CA bundle is missing. Run it on the machine (or builder stage) that built
# the binary, so the libraries match the ones it was linked against.
#
#   deploy/container/rootfs.sh BINARY DEST
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BINARY DEST" >&2
  exit 2
fi
bin=$1
dest=$2
ca=/etc/ssl/certs/ca-certificates.crt

[ -x "$bin" ] || { echo "$bin: not an executable file" >&2; exit 1; }
[ -s "$ca" ] || { echo "$ca: missing (install ca-certificates)" >&2; exit 1; }

mkdir -p "$dest/usr/local/bin" "$dest/etc/ssl/certs" "$dest/tmp"
chmod 1777 "$dest/tmp"
install -m 0755 "$bin" "$dest/usr/local/bin/deprov"

libs=$(ldd "$bin")
if grep -q 'not found' <<<"$libs"; then
  echo "$bin: ldd cannot find a library:" >&2
  echo "$libs" >&2
  exit 1
fi
# Every absolute path ldd prints: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and the
# loader's `/lib64/ld-linux-x86-64.so.2 (0x...)`. Copied with symlinks resolved, under the path
# the binary and the loader look for.
copied=0
while read -r lib; do
  mkdir -p "$dest$(dirname "$lib")"
  cp -L "$lib" "$dest$lib"
  copied=$((copied + 1))
done < <(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' <<<"$libs" | sort -u)
if [ "$copied" -eq 0 ]; then
  echo "$bin: ldd names no library; expected a binary linked against glibc" >&2
  exit 1
fi

cp -L "$ca" "$dest$ca"
cat >"$dest/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
PASSWD
cat >"$dest/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
echo 'hosts: files dns' >"$dest/etc/nsswitch.conf"
echo "rootfs.sh: $dest: deprov, $copied shared objects, CA bundle, passwd/group (nonroot 65532)"
