#!/usr/bin/env bash
# make bench: start a daemon on a loopback port with its own data dir, measure create, exec and file
# transfer beside same-run baselines (bare runc run, local fork/exec, local cp), and write the table to
# docs/benchmarks.md. The data dir is kept between runs so the base template is built only once.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${BENCH_DATA_DIR:-/var/lib/airlock-bench}
PORT=${BENCH_PORT:-17070}
KEY="ak_bench_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
mkdir -p "$DATA_DIR"
LOG=$(mktemp)
AIRLOCK_ADMIN_KEY="$KEY" bin/airlock serve --listen "127.0.0.1:$PORT" --data-dir "$DATA_DIR" 2>"$LOG" &
PID=$!
cleanup() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; rm -f "$LOG"; }
trap cleanup EXIT
echo "waiting for the daemon (the base template is built on the first run, ≈30 s)…"
for _ in $(seq 1 600); do
	if curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; then break; fi
	if ! kill -0 "$PID" 2>/dev/null; then cat "$LOG" >&2; exit 1; fi
	sleep 0.5
done
ROOTFS=$(ls -d "$DATA_DIR"/templates/base/*/rootfs | sort -V | tail -1)
OUT=$(mktemp)
status=0
bin/airlock-bench --url "http://127.0.0.1:$PORT" --api-key "$KEY" --rootfs "$ROOTFS" "$@" | tee "$OUT" || status=$?
{
	echo "# Benchmarks"
	echo
	echo "Measured by \`make bench\` (scripts/bench.sh → cmd/airlock-bench) on $(date -u +%Y-%m-%d), $(nproc) vCPU,"
	echo "kernel $(uname -r), runc $(runc --version | head -1 | awk '{print $3}'). Each figure is beside the same run's"
	echo "baseline; the targets are ARCHITECTURE.md's. Re-run \`make bench\` to refresh this page."
	echo
	cat "$OUT"
} > docs/benchmarks.md
rm -f "$OUT"
exit $status
