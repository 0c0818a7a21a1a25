#!/usr/bin/env python3
"""What the Python SDK adds to an exec round trip over raw HTTP.

Against the daemon at AIRLOCK_URL with AIRLOCK_API_KEY it creates a base
sandbox (or uses --sandbox), then runs ``echo hi`` n times through the SDK
(``sbx.commands.run``) and n times as raw HTTP from the same language (one
persistent ``http.client`` connection, the request's JSON encoded and the
answer's decoded, as a hand-written client would), interleaved so that both
see the same load. It prints one JSON line: the p50 of each, the p50 of the
per-pair difference, the client CPU time per call of each, and whether the
target (at most 0.5 ms added, judged on the per-pair difference: on a
loaded host an exec's own latency varies by more than that, and pairing
cancels what both kinds share) holds; exit status 1 when it does not.

    python3 sdk/python/bench_overhead.py [-n 1000] [--sandbox sbx_…]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
import urllib.parse
from typing import Callable, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from airlock import Sandbox  # noqa: E402

TARGET_MS = 0.5


def raw_client(url: str, key: str, sandbox_id: str) -> Callable[[], None]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=90)
    path = u.path.rstrip("/") + "/v1/sandboxes/%s/exec" % sandbox_id
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json", "Accept": "application/json"}

    def call() -> None:
        body = json.dumps({"cmd": ["echo", "hi"], "timeout_s": 60}).encode()
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        if resp.status != 200 or doc.get("stdout") != "hi\n":
            raise SystemExit("raw exec failed: %d %r" % (resp.status, doc))

    return call


def sdk_client(sbx: Sandbox) -> Callable[[], None]:
    def call() -> None:
        r = sbx.commands.run(["echo", "hi"], timeout=60)
        if r.stdout != "hi\n" or r.exit_code != 0:
            raise SystemExit("sdk exec failed: %r" % r)

    return call


def timed(f: Callable[[], None]) -> Tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    f()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=1000, help="round trips of each kind (default 1000)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--sandbox", help="an existing sandbox to use (else a base one is made and deleted)")
    a = ap.parse_args()
    url = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:7070")
    key = os.environ.get("AIRLOCK_API_KEY", "")
    sbx = Sandbox.connect(a.sandbox) if a.sandbox else Sandbox.create(template="base", ttl=600)
    try:
        raw, sdk = raw_client(url, key, sbx.id), sdk_client(sbx)
        for _ in range(a.warmup):
            raw()
            sdk()
        raw_ms: List[float] = []
        sdk_ms: List[float] = []
        raw_cpu: List[float] = []
        sdk_cpu: List[float] = []
        for i in range(a.n):
            # Alternate which goes first, so neither always follows the other.
            for kind in ((raw, raw_ms, raw_cpu), (sdk, sdk_ms, sdk_cpu))[:: 1 if i % 2 == 0 else -1]:
                ms, cpu = timed(kind[0])
                kind[1].append(ms)
                kind[2].append(cpu)
        diff = [s - r for s, r in zip(sdk_ms, raw_ms)]
        out = {
            "bench": "python_sdk_exec_overhead",
            "n": a.n,
            "raw_p50_ms": round(statistics.median(raw_ms), 3),
            "sdk_p50_ms": round(statistics.median(sdk_ms), 3),
            "overhead_p50_ms": round(statistics.median(sdk_ms) - statistics.median(raw_ms), 3),
            "pair_diff_p50_ms": round(statistics.median(diff), 3),
            "raw_cpu_ms": round(statistics.mean(raw_cpu), 3),
            "sdk_cpu_ms": round(statistics.mean(sdk_cpu), 3),
            "cpu_overhead_ms": round(statistics.mean(sdk_cpu) - statistics.mean(raw_cpu), 3),
            "target_ms": TARGET_MS,
        }
        out["ok"] = out["pair_diff_p50_ms"] <= TARGET_MS
        print(json.dumps(out))
        return 0 if out["ok"] else 1
    finally:
        if not a.sandbox:
            sbx.kill()
        sbx.close()


if __name__ == "__main__":
    sys.exit(main())
