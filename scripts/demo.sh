#!/usr/bin/env bash
# The main job: a real transfer between two processes. Starts a server,
# writes then reads with every byte checked over shm and over tcp;ofi_rxm,
# prints the figures (fabtests' columns), stops the server.
set -euo pipefail
bin=${BIN:-bin/fitransfer}
out=$(mktemp)
server=
cleanup() {
	[ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
	rm -f "$out"
}
trap cleanup EXIT

"$bin" doctor | tail -n 1
"$bin" serve --listen 127.0.0.1:0 --size 64m >"$out" 2>&1 &
server=$!
for _ in $(seq 300); do
	grep -q '^listening on' "$out" && break
	kill -0 "$server" 2>/dev/null || { cat "$out"; echo "demo: the server did not start" >&2; exit 1; }
	sleep 0.1
done
addr=$(awk '/^listening on/ {print $3; exit}' "$out")
[ -n "$addr" ] || { cat "$out"; echo "demo: no server address" >&2; exit 1; }
echo "server: $(head -n 1 "$out")"

# cma: same node, fitransfer's own process_vm path (the default on
# libfabric 1.x); shm: libfabric's shm provider; tcp: tcp;ofi_rxm.
for p in cma shm tcp; do
	echo
	echo "== $p: write (the server checks every byte)"
	"$bin" write "$addr" -p "$p" -S 4k,64k,1m -I 200 --verify
	echo "== $p: read (every byte checked here)"
	"$bin" read "$addr" -p "$p" -S 4k,64k,1m -I 200 --verify
	echo "== $p: pingpong"
	"$bin" pingpong "$addr" -p "$p" -S 8,4k -I 1000 --verify
done
echo
echo "demo: all transfers verified"
