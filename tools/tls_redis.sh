#!/usr/bin/env bash
# Best effort: unpack a Redis server built with TLS (Debian's redis-tools, with the two
# libraries it needs beyond the base system) under DEST, without installing anything, so the
# cluster-bus TLS tests (tests/integration/test_cluster_bus.py) run the attack, not only the
# refusal: the embedded Valkey build has no TLS. Never fails the build: without apt or the
# packages, it says so and the tests fall back to checking the refusal.
# Usage: tools/tls_redis.sh DEST   (DEST/redis-server is the entry point)
set -u
dest=$1
note() { echo "tls_redis: $*; the cluster-bus TLS attack test checks the refusal only" >&2; }
command -v apt-get >/dev/null && command -v dpkg >/dev/null || { note "no apt-get/dpkg"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pkgs="redis-tools libjemalloc2 liblzf1"
fetch() { (cd "$tmp" && timeout 120 apt-get download -q $pkgs) >/dev/null 2>&1; }
fetch || { timeout 300 apt-get update -qq >/dev/null 2>&1 && fetch; } || { note "apt-get download $pkgs failed"; exit 0; }
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/root"; done
rm -rf "$dest" && mkdir -p "$dest" && cp -a "$tmp/root/usr" "$dest/"
# the server is redis-check-rdb under the name redis-server (the binary picks its mode from
# argv[0]; Debian's redis-server package only adds that link and a service)
ln -sf redis-check-rdb "$dest/usr/bin/redis-server"
cat > "$dest/redis-server" <<SH
#!/bin/sh
LD_LIBRARY_PATH="$dest/usr/lib/x86_64-linux-gnu" exec "$dest/usr/bin/redis-server" "\$@"
SH
chmod 0755 "$dest/redis-server"
"$dest/redis-server" --version >/dev/null 2>&1 || { note "the unpacked server does not run"; rm -rf "$dest"; exit 0; }
