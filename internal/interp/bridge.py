# airlock code-interpreter bridge (runs in the sandbox as the sandbox user).
#
# argv: MODE FIFO   (MODE: python | bash)
# Requests arrive as JSON lines on stdin: {"op": "run", "id": ..., "code": ...}.
# Events leave as JSON lines on FIFO, each tagged with the request's id:
#   {"id", "t": "stdout"|"stderr", "text"}
#   {"id", "t": "result", "main": bool, "data": {mime: value}}
#   {"id", "t": "error", "name", "value", "traceback"}
#   {"id", "t": "end", "n": execution_count}
# The daemon interrupts a cell with SIGINT to the whole process tree; the
# bridge ignores it and the kernel stops the cell. When the kernel dies the
# bridge exits, which ends the FIFO: the daemon reports the death.
import json
import os
import re
import signal
import sys
import threading

signal.signal(signal.SIGINT, signal.SIG_IGN)

MODE, FIFO = sys.argv[1], sys.argv[2]
# O_RDWR: the open does not wait for the daemon, and the daemon's read ends
# exactly when this process (the only writer) is gone.
OUT = os.open(FIFO, os.O_RDWR)
LOCK = threading.Lock()
# Per-cell output budget of streams; results have their own cap. The daemon
# enforces its own limits too: this one only keeps a runaway loop's output
# from crossing the sandbox boundary at all.
MAX_STREAM = 8 << 20
MAX_RESULT = 24 << 20
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def emit(ev):
    b = (json.dumps(ev, separators=(",", ":")) + "\n").encode()
    with LOCK:
        view = memoryview(b)
        while view:
            n = os.write(OUT, view)
            view = view[n:]


class Cell:
    def __init__(self, rid):
        self.id = rid
        self.stream_bytes = 0
        self.cut = False

    def stream(self, name, text):
        if self.cut:
            return
        self.stream_bytes += len(text)
        if self.stream_bytes > MAX_STREAM:
            self.cut = True
            emit({"id": self.id, "t": "error", "name": "OutputLimitExceeded",
                  "value": "the cell's output passed %d bytes; the rest is dropped" % MAX_STREAM, "traceback": ""})
            return
        emit({"id": self.id, "t": name, "text": text})

    def result(self, main, data):
        size = sum(len(v) if isinstance(v, str) else len(json.dumps(v)) for v in data.values())
        if size > MAX_RESULT:
            emit({"id": self.id, "t": "error", "name": "OutputLimitExceeded",
                  "value": "a result of %d bytes was dropped" % size, "traceback": ""})
            return
        emit({"id": self.id, "t": "result", "main": main, "data": data})


def ready():
    sys.stdout.write("AIRLOCK-CODE-READY\n")
    sys.stdout.flush()


def requests():
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if isinstance(req, dict) and req.get("op") == "run":
            yield str(req.get("id", "")), str(req.get("code", ""))


# ---------------------------------------------------------------- python
def run_python():
    import queue
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    env = dict(os.environ)
    # Figures come back as PNG: shown ones and those left open at the end
    # of a cell (the inline backend's post-execute flush).
    env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
    env.pop("AIRLOCK_CODE_BRIDGE", None)
    km.start_kernel(env=env, cwd=os.getcwd())
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=120)
    ready()
    for rid, code in requests():
        cell = Cell(rid)
        msg_id = kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        count = 0
        while True:
            try:
                msg = kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                if not km.is_alive():
                    os._exit(3)
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "stream":
                cell.stream("stderr" if c.get("name") == "stderr" else "stdout", c.get("text", ""))
            elif t == "execute_input":
                count = c.get("execution_count") or count
            elif t == "execute_result":
                count = c.get("execution_count") or count
                cell.result(True, c.get("data", {}))
            elif t in ("display_data", "update_display_data"):
                cell.result(False, c.get("data", {}))
            elif t == "error":
                tb = "\n".join(ANSI.sub("", x) for x in c.get("traceback", []))
                emit({"id": rid, "t": "error", "name": c.get("ename", ""),
                      "value": ANSI.sub("", c.get("evalue", "")), "traceback": tb})
            elif t == "status" and c.get("execution_state") == "idle":
                break
        emit({"id": rid, "t": "end", "n": count})


# ---------------------------------------------------------------- bash
def run_bash():
    import secrets
    import subprocess
    import tempfile

    marker = ("\x01AIRLOCK-END-%s " % secrets.token_hex(8)).encode()
    # trap: ^C stops the running command and returns from the cell (the
    # cell is sourced); a trapped signal is reset in children, an ignored
    # one would be inherited.
    p = subprocess.Popen(["/bin/bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    p.stdin.write(b"trap 'return 130 2>/dev/null' INT\n")
    p.stdin.flush()
    tmp = tempfile.mkdtemp(prefix=".airlock-bash-")
    state = {"cell": None}
    ended = {"out": threading.Event(), "err": threading.Event()}
    status = {"code": 0}

    def pump(fd, name, key):
        # Output is streamed as it comes; a tail that might be the start of
        # the end marker is held back until the next read tells.
        buf = b""
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                os._exit(3)  # bash is gone: the kernel died
            buf += chunk
            while True:
                i = buf.find(marker)
                if i < 0:
                    break
                j = buf.find(b"\n", i)
                if j < 0:
                    break
                send(name, buf[:i])
                rest = buf[i + len(marker):j]
                if key == "out":
                    try:
                        status["code"] = int(rest)
                    except ValueError:
                        status["code"] = 1
                buf = buf[j + 1:]
                ended[key].set()
            hold = 0
            for k in range(min(len(marker), len(buf)), 0, -1):
                if marker.startswith(buf[-k:]):
                    hold = k
                    break
            i = buf.find(marker)
            if i >= 0:
                hold = len(buf) - i
            send(name, buf[:len(buf) - hold])
            buf = buf[len(buf) - hold:]

    def send(name, b):
        if b and state["cell"] is not None:
            state["cell"].stream("stdout" if name == "out" else "stderr", b.decode("utf-8", "replace"))

    threading.Thread(target=pump, args=(p.stdout.fileno(), "out", "out"), daemon=True).start()
    threading.Thread(target=pump, args=(p.stderr.fileno(), "err", "err"), daemon=True).start()
    ready()
    n = 0
    for rid, code in requests():
        n += 1
        cell = Cell(rid)
        state["cell"] = cell
        for e in ended.values():
            e.clear()
        path = os.path.join(tmp, "cell.sh")
        with open(path, "w") as f:
            f.write(code + "\n")
        m = marker.decode()
        script = 'source %s\nprintf "%%s%%d\\n" "%s" $?\nprintf "%%s0\\n" "%s" >&2\n' % (path, m, m)
        try:
            p.stdin.write(script.encode())
            p.stdin.flush()
        except OSError:
            os._exit(3)
        ended["out"].wait()
        ended["err"].wait()
        state["cell"] = None
        if status["code"] != 0:
            name = "KeyboardInterrupt" if status["code"] == 130 else "ExitStatus"
            emit({"id": rid, "t": "error", "name": name, "value": "exit status %d" % status["code"], "traceback": ""})
        emit({"id": rid, "t": "end", "n": n})


if MODE == "python":
    run_python()
elif MODE == "bash":
    run_bash()
else:
    sys.stderr.write("unknown mode %s\n" % MODE)
    sys.exit(2)
