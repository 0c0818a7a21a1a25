#!/usr/bin/env bash
# make e2b-suite: E2B's own JS SDK test suite (kept outside this repository, in E2B_SUITE_DIR) against a
# daemon of this tree. Builds bin/, starts `airlock serve` on 127.0.0.1 with a temp data dir over the
# shared template cache, creates a tenant key, runs the suite's run.sh against it and, for a full run,
# writes the per-file table into docs/e2b.md between the e2b-suite markers. Stops the daemon it started
# (by its PID) whatever happens. Root, runc, node, npm, ip and nsenter; npm fetches the suite's pinned
# packages once.
#
# Usage: scripts/e2b-suite.sh [path-filter]      (a filter runs part of the suite and leaves docs alone)
# Env:   E2B_SUITE_DIR   the suite (default ../shared/e2b-suite beside the repository, or beside the
#                        main checkout from a linked worktree)
#        E2B_SUITE_WORK  scratch dir of the suite's npm install and logs, kept between runs
#                        (default ${XDG_CACHE_HOME:-~/.cache}/airlock-e2b-suite); the daemon's log of
#                        the run is left in its results/ beside the suite's
#        AIRLOCK_TEST_DATA_DIR  the shared template cache's parent (default /var/lib/airlock-test)
#        PER_FILE_TIMEOUT       passed to run.sh (seconds per test file)
#
# Nothing the suite does leaves this host: the daemon (its API, and its network side: veths, nftables,
# DNS, proxy and their upstream connections) and the suite's node processes run in a network namespace
# the script makes, with nothing but loopback. Sandboxes get their usual networks, and the SDK reaches
# the daemon on that loopback, but a sandbox's or the SDK's attempt to reach the internet (the suite's
# internet cases, getHost() names under e2b.app) finds no route: those cases fail here by design
# (docs/e2b.md says which). Outside it, first: the npm install and a daemon start that prepares the
# base template if its recipe is not cached (debootstrap from the host's mirror, as `make run` does).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
FILTER="${1:-}"
SUITE="${E2B_SUITE_DIR:-$REPO/../shared/e2b-suite}"
if [ -z "${E2B_SUITE_DIR:-}" ] && [ ! -e "$SUITE" ]; then
	# In a linked worktree: beside the main checkout.
	common=$(git rev-parse --path-format=absolute --git-common-dir 2>/dev/null || true)
	[ -n "$common" ] && SUITE="$(dirname "$common")/../shared/e2b-suite"
fi
if [ ! -x "$SUITE/run.sh" ]; then
	echo "e2b-suite: no runnable $SUITE/run.sh: set E2B_SUITE_DIR to the folder of E2B's JS SDK suite and its runner" >&2
	exit 2
fi
SUITE=$(cd "$SUITE" && pwd)
[ "$(id -u)" = 0 ] || { echo "e2b-suite: needs root (the daemon runs real sandboxes)" >&2; exit 2; }
for b in runc node npm curl ip nsenter; do
	command -v "$b" >/dev/null || { echo "e2b-suite: $b not found (make deps)" >&2; exit 2; }
done
CACHE="${AIRLOCK_TEST_DATA_DIR:-/var/lib/airlock-test}/templates"
WORK="${E2B_SUITE_WORK:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock-e2b-suite}"

make --no-print-directory build >/dev/null
REV=$(git describe --always --dirty 2>/dev/null || echo unknown) # what was built

mkdir -p "$CACHE" "$WORK"
rm -rf "$WORK/results"
DATA=$(mktemp -d /tmp/airlock-e2b-suite.XXXXXX)
chmod 0711 "$DATA" # sandbox uids traverse it to their layers
ln -s "$CACHE" "$DATA/templates"
LOG="$DATA.log"
OUT="$DATA.out"
KEY="ak_e2bsuite_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
NETNS="airlock-e2b-suite-$$"
INNS=(nsenter "--net=/run/netns/$NETNS" --)

PID=""
URL=""
# stop_daemon deletes every sandbox of the daemon (a stopping daemon leaves
# its sandboxes to be adopted by its next start), then ends it.
stop_daemon() {
	[ -n "$PID" ] || return 0
	if [ -n "$URL" ]; then
		ids=$(AIRLOCK_URL="$URL" AIRLOCK_API_KEY="$KEY" "${INNS[@]}" bin/airlock sandbox ls -o json 2>/dev/null |
			node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{try{for(const x of JSON.parse(s))if(x.state!=="stopped")console.log(x.id)}catch{}})' || true)
		[ -z "$ids" ] || AIRLOCK_URL="$URL" AIRLOCK_API_KEY="$KEY" "${INNS[@]}" bin/airlock sandbox rm $ids >/dev/null 2>&1 || true
	fi
	kill -TERM "$PID" 2>/dev/null || true
	wait "$PID" 2>/dev/null || true
	PID="" URL=""
}
cleanup() {
	local st=$?
	stop_daemon
	ip netns del "$NETNS" 2>/dev/null || true
	[ -d "$WORK/results" ] && cp "$LOG" "$WORK/results/daemon.log" 2>/dev/null || true
	# The daemon removes its sandboxes' mounts as it stops; a data dir that
	# still has one is left for a look rather than removed under it.
	if grep -qF " $DATA/" /proc/self/mountinfo; then
		echo "e2b-suite: mounts left under $DATA; not removed (daemon log: $LOG)" >&2
	else
		rm -rf "$DATA"
		[ "$st" = 0 ] && rm -f "$LOG"
	fi
	rm -f "$OUT"
	exit "$st"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start_daemon [wrapper…]: `airlock serve` on a free loopback port (read back
# from its log), without previews (their default port may be a serving
# daemon's), its network side in the namespace; waits until it is ready.
start_daemon() {
	: >"$LOG"
	AIRLOCK_ADMIN_KEY="$KEY" AIRLOCK_TEST_HOST_NETNS="/run/netns/$NETNS" AIRLOCK_PREVIEW_LISTEN= \
		"$@" bin/airlock serve --listen 127.0.0.1:0 --data-dir "$DATA" 2>>"$LOG" &
	PID=$!
	for _ in $(seq 1 2400); do # 20 minutes: a base build on a busy host
		if [ -z "$URL" ]; then
			addr=$(grep -o '"msg":"airlock serving","addr":"[^"]*"' "$LOG" | head -1 | sed 's/.*"addr":"//; s/"$//' || true)
			[ -n "$addr" ] && URL="http://$addr"
		fi
		if [ -n "$URL" ] && "$@" curl -fsS "$URL/readyz" >/dev/null 2>&1; then return 0; fi
		if ! kill -0 "$PID" 2>/dev/null; then
			echo "e2b-suite: the daemon exited; its log:" >&2
			tail -50 "$LOG" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "e2b-suite: the daemon did not become ready; log: $LOG" >&2
	exit 1
}

ip netns add "$NETNS"
ip -n "$NETNS" link set lo up
# The suite's scratch copy and npm install (a filter that matches no file),
# then the base template if the cache lacks its recipe: both need the
# network, so outside the namespace.
WORK="$WORK" AIRLOCK_URL=http://127.0.0.1:9 AIRLOCK_KEY=none "$SUITE/run.sh" '@@install only@@' >/dev/null ||
	{ echo "e2b-suite: preparing the suite in $WORK failed" >&2; exit 1; }
echo "e2b-suite: preparing the base template in $CACHE (built only if its recipe is not there yet)"
start_daemon
stop_daemon
start_daemon "${INNS[@]}"
echo "e2b-suite: daemon pid $PID at $URL in network namespace $NETNS, data dir $DATA"

# A tenant key in E2B's format (e2b_<hex>), so the SDKs' own key checks pass;
# a native one from a daemon that does not issue them (run.sh turns the
# Python-style check off anyway, and the JS SDK makes none).
keys() { AIRLOCK_URL="$URL" AIRLOCK_API_KEY="$KEY" "${INNS[@]}" bin/airlock keys create --tenant e2bsuite --name e2b-suite "$@" 2>/dev/null; }
if ! TENANT_KEY=$(keys --format e2b); then
	echo "e2b-suite: this daemon issues no e2b_ keys; using a native key"
	TENANT_KEY=$(keys)
fi

echo "e2b-suite: running $SUITE/run.sh ${FILTER:+(filter $FILTER) }against $URL; scratch $WORK"
WORK="$WORK" AIRLOCK_URL="$URL" AIRLOCK_KEY="$TENANT_KEY" "${INNS[@]}" "$SUITE/run.sh" ${FILTER:+"$FILTER"} | tee "$OUT"
total=$(grep '^e2b-suite: ' "$OUT" | tail -1 || true)
[ -n "$total" ] || { echo "e2b-suite: run.sh printed no total" >&2; exit 1; }

if [ -n "$FILTER" ]; then
	echo "e2b-suite: filtered run; docs/e2b.md left as it is"
	exit 0
fi
# The per-file table, between the markers of docs/e2b.md.
TABLE=$(mktemp)
{
	echo "<!-- e2b-suite:begin (written by make e2b-suite; do not edit by hand) -->"
	echo "Measured by \`make e2b-suite\` on $(date -u +%Y-%m-%d) at $REV: E2B's JS SDK tests at \`e2b@2.45.0\`"
	echo "with the npm \`e2b@2.45.0\`, against runc sandboxes, in a network namespace with loopback only."
	echo "Total: ${total#e2b-suite: }."
	echo
	echo "| file | passed | failed |"
	echo "|---|---:|---:|"
	sed -nE 's#^tests/(.*\.test\.ts): ([0-9]+) passed, ([0-9]+) failed$#| `\1` | \2 | \3 |#p' "$OUT"
	echo "<!-- e2b-suite:end -->"
} >"$TABLE"
if ! grep -q '^<!-- e2b-suite:begin' docs/e2b.md || ! grep -q '^<!-- e2b-suite:end -->' docs/e2b.md; then
	echo "e2b-suite: docs/e2b.md has no e2b-suite markers; the table is in $TABLE" >&2
	exit 1
fi
awk -v table="$TABLE" '
	/^<!-- e2b-suite:begin/ { while ((getline l < table) > 0) print l; skip = 1; next }
	/^<!-- e2b-suite:end -->/ { skip = 0; next }
	!skip { print }
' docs/e2b.md >docs/e2b.md.new && mv docs/e2b.md.new docs/e2b.md
rm -f "$TABLE"
echo "e2b-suite: table written to docs/e2b.md; logs in $WORK/results"
