#!/usr/bin/env python3
"""An agent backend's tool call, end to end: the model writes a script, the
backend runs it in a fresh sandbox and returns only output it has checked.

    export AIRLOCK_URL=http://127.0.0.1:7070 AIRLOCK_API_KEY=ak_…
    python3 examples/python/agent_flow.py ["task"] [--timeout 30] [--runtime runc]

The model call is stubbed (fake_model): it answers the task "add 12, 8 and
5" with a fixed script, so the path can be checked before a model is added.
The flow: create a sandbox with a short TTL and no network; check that it
got the runtime asked for (a weaker one must not be accepted silently);
write the script; run it as the unprivileged ``user`` with a timeout;
treat its output as untrusted (exit code, size, JSON of the expected
shape); and always delete the sandbox, also when something failed.

The API key stays in this process: nothing of it reaches the sandbox.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict

from airlock import AirlockError, ExecTimeout, Sandbox

#: the most output this tool accepts from the task
MAX_OUTPUT = 4096


def fake_model(task: str) -> str:
    """Stands in for the model: the script it would write for task."""
    if task.startswith("add "):
        return "\n".join([
            "import json",
            "values = [12, 8, 5]",
            "print(json.dumps({'total': sum(values)}))",
        ])
    if task.startswith("loop"):
        return "while True:\n    pass\n"
    return "print('hello, I am not JSON')\n"


def check_output(stdout: str) -> Dict[str, Any]:
    """The task's output, if it is exactly what the application expects."""
    if len(stdout.encode("utf-8")) > MAX_OUTPUT:
        raise ValueError("task output exceeds the application limit")
    try:
        out = json.loads(stdout)
    except ValueError:
        raise ValueError("unexpected task output: not JSON") from None
    if not isinstance(out, dict) or set(out) != {"total"} or not isinstance(out["total"], int) or isinstance(out["total"], bool):
        raise ValueError("unexpected task output: not {\"total\": <int>}")
    return out


def run_task(task: str, runtime: str, timeout: float) -> Dict[str, Any]:
    script = fake_model(task)
    with Sandbox.create(template="base", runtime=runtime, ttl=120, network="none") as sbx:
        if sbx.runtime != runtime:
            raise RuntimeError("this task requires the %s runtime, got %s" % (runtime, sbx.runtime))
        sbx.files.write("task.py", script)  # /home/user/task.py
        result = sbx.commands.run(["python3", "task.py"], user="user", timeout=timeout)
        if result.exit_code != 0 or result.truncated:
            raise RuntimeError("task failed (exit %s): %s" % (result.exit_code, result.stderr[-500:]))
        return check_output(result.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description="run a model-written script in an airlock sandbox")
    ap.add_argument("task", nargs="?", default="add 12, 8 and 5")
    ap.add_argument("--timeout", type=float, default=30, help="seconds the script may run (default 30)")
    ap.add_argument("--runtime", default="runc", help="the runtime the task requires (runc, gvisor, …)")
    a = ap.parse_args()
    try:
        out = run_task(a.task, a.runtime, a.timeout)
    except ExecTimeout:
        print("task timed out after %gs and was killed" % a.timeout, file=sys.stderr)
        return 1
    except (AirlockError, RuntimeError, ValueError) as e:
        print("task failed: %s" % e, file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
