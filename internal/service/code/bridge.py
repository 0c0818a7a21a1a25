# airlock code-interpreter bridge (runs in the sandbox as the sandbox user).
#
# argv: MODE FIFO   (MODE: python | bash)
# Requests arrive as JSON lines on stdin: {"op": "run", "id": ..., "code": ...,
# "env": {name: value}}. env is set for that cell only: afterwards every
# name has its earlier value again (or is unset).
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
# The daemon checks env names; the bridge checks again before it puts them
# in code.
ENV_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,255}\Z")


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
            env = req.get("env")
            if not isinstance(env, dict):
                env = {}
            env = {k: v for k, v in env.items()
                   if isinstance(k, str) and isinstance(v, str) and ENV_NAME.match(k) and "\0" not in v}
            yield str(req.get("id", "")), str(req.get("code", "")), env


# ---------------------------------------------------------------- python
# CHART_MIME carries a matplotlib figure's data (E2B's Result.chart) next to
# its PNG, DATA_MIME a pandas DataFrame's columns (E2B's Result.data). The
# daemon takes them only under these names.
CHART_MIME = "application/vnd.airlock.chart+json"
DATA_MIME = "application/vnd.airlock.data+json"

# CHARTS runs in the kernel (in a namespace of its own, so the user's is
# untouched) and adds two display formatters: a figure that is displayed
# (plt.show(), or left open at the end of a cell) also gives its data in
# E2B's chart shape, and a displayed DataFrame its columns as lists.
# matplotlib and pandas are not imported here: a figure or a frame can only
# exist once the cell imported them. Any failure gives no chart or data,
# never an error in the cell.
CHARTS = r"""
import datetime, math, numbers, re, sys
from IPython import get_ipython
from IPython.core.formatters import BaseFormatter
from traitlets import Unicode

# Past it a figure gets no chart (the PNG stays), a frame no data (its
# HTML and text stay).
MAX_POINTS = 100000
UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


def value(v):
    # A JSON value for a cell of a frame or a point: numpy scalars become
    # numbers, dates ISO strings, NaN and infinities null.
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    name = type(v).__name__
    if name == "datetime64":
        return str(v.astype("datetime64[s]"))
    if name == "bool_":
        return bool(v)
    if isinstance(v, numbers.Integral):
        return int(v)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


def name(label, prefix, kind):
    # Unlabelled artists are "_child3", "_container1": E2B says "Line 3".
    if label.startswith(prefix) and label[len(prefix):].isdigit():
        return "%s %s" % (kind, label[len(prefix):])
    return label


def scale(axis, ax_scale):
    conv = getattr(axis, "converter", None)
    mod = type(conv).__module__ if conv is not None else ""
    if mod == "matplotlib.dates":
        return "datetime"
    if mod == "matplotlib.category":
        return "categorical"
    return ax_scale


def ticks(axis, kind):
    out = []
    for t in axis.get_ticklocs():
        if kind == "datetime":
            import matplotlib.dates
            out.append(matplotlib.dates.num2date(t).isoformat())
        else:
            out.append(value(t))
    return out


def base(ax, kind):
    return {"type": kind, "title": ax.get_title() or None, "elements": []}


def planar(ax, kind):
    c = base(ax, kind)
    for a in ("x", "y"):
        label = getattr(ax, "get_%slabel" % a)() or None
        m = UNIT.search(label) if label else None
        c[a + "_label"] = label
        c[a + "_unit"] = (m.group(1) or m.group(2)) if m else None
    return c


def point(ax, kind):
    c = planar(ax, kind)
    for a, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
        sc = scale(axis, getattr(ax, "get_%sscale" % a)())
        c[a + "_scale"] = sc
        c[a + "_ticks"] = ticks(axis, sc)
        c[a + "_tick_labels"] = [t.get_text() for t in axis.get_ticklabels()]
    return c


def kind_of(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.patches import Rectangle, Wedge
    lines, cols, patches = list(ax.lines), list(ax.collections), list(ax.patches)
    if patches and not lines and not cols and all(isinstance(p, Wedge) for p in patches):
        return "pie"
    if patches and ax.containers and not lines and not cols and all(isinstance(p, Rectangle) for p in patches):
        return "bar"
    if cols and not lines and not patches and all(isinstance(x, PathCollection) for x in cols):
        return "scatter"
    if lines and not cols and not patches:
        return "line"
    return "unknown"


def axes_chart(ax, budget):
    kind = kind_of(ax)
    if kind == "line":
        c = point(ax, kind)
        for ln in ax.lines:
            pts = [[value(x), value(y)] for x, y in zip(ln.get_xdata(), ln.get_ydata())]
            budget[0] -= len(pts)
            c["elements"].append({"label": name(ln.get_label(), "_child", "Line"), "points": pts})
    elif kind == "scatter":
        c = point(ax, kind)
        for col in ax.collections:
            pts = [[value(x), value(y)] for x, y in col.get_offsets()]
            budget[0] -= len(pts)
            c["elements"].append({"label": name(col.get_label(), "_child", "Series"), "points": pts})
    elif kind == "bar":
        c = planar(ax, kind)
        for cont in ax.containers:
            horizontal = getattr(cont, "orientation", "vertical") == "horizontal"
            axis = ax.yaxis if horizontal else ax.xaxis
            labels = {}
            for t, lab in zip(axis.get_ticklocs(), axis.get_ticklabels()):
                labels[round(float(t), 6)] = lab.get_text()
            group = name(cont.get_label() or "", "_container", "Group")
            for r in cont:
                if horizontal:
                    pos, v = r.get_y() + r.get_height() / 2, r.get_width()
                else:
                    pos, v = r.get_x() + r.get_width() / 2, r.get_height()
                label = labels.get(round(float(pos), 6), str(value(pos)))
                c["elements"].append({"label": label, "group": group, "value": value(v)})
                budget[0] -= 1
        if any(getattr(cont, "orientation", "") == "horizontal" for cont in ax.containers):
            # E2B names the axes by the bars: x is where they stand.
            for a, b in (("x_label", "y_label"), ("x_unit", "y_unit")):
                c[a], c[b] = c[b], c[a]
    elif kind == "pie":
        c = base(ax, kind)
        for w in ax.patches:
            c["elements"].append({"label": w.get_label(), "angle": abs(round(w.theta2 - w.theta1, 4)),
                                  "radius": value(w.r)})
            budget[0] -= 1
    else:
        c = base(ax, kind)
    return c


def chart(fig):
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    if not axes:
        return None
    budget = [MAX_POINTS]
    if len(axes) == 1:
        c = axes_chart(axes[0], budget)
    else:
        st = getattr(fig, "_suptitle", None)
        c = {"type": "superchart", "title": (st.get_text() if st is not None else "") or None,
             "elements": [axes_chart(ax, budget) for ax in axes]}
    return c if budget[0] >= 0 else None


def frame(df):
    if df.shape[0] * max(df.shape[1], 1) > MAX_POINTS:
        return None
    return {str(col): [value(v) for v in df[col].tolist()] for col in df.columns}


class ChartFormatter(BaseFormatter):
    format_type = Unicode(CHART_MIME)

    def __call__(self, obj):
        fig = sys.modules.get("matplotlib.figure")
        if fig is None or not isinstance(obj, fig.Figure):
            return None
        try:
            return chart(obj)
        except Exception:
            return None


class DataFormatter(BaseFormatter):
    format_type = Unicode(DATA_MIME)

    def __call__(self, obj):
        pd = sys.modules.get("pandas")
        if pd is None or not isinstance(obj, getattr(pd, "DataFrame", ())):
            return None
        try:
            return frame(obj)
        except Exception:
            return None


ip = get_ipython()
ip.display_formatter.formatters[CHART_MIME] = ChartFormatter(parent=ip.display_formatter)
ip.display_formatter.formatters[DATA_MIME] = DataFormatter(parent=ip.display_formatter)
"""


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

    def expression(expr):
        # Evaluates expr in the kernel without touching its state: a silent
        # execute of no code keeps the execution count, history, _ and Out,
        # and the expression's value comes back in the shell reply. An
        # interrupt meant for a cell can land here; the expression is
        # retried then (the callers' expressions are idempotent).
        for _ in range(20):
            msg_id = kc.execute("", silent=True, store_history=False, user_expressions={"v": expr},
                                allow_stdin=False, stop_on_error=False)
            while True:
                try:
                    msg = kc.get_shell_msg(timeout=0.25)
                except queue.Empty:
                    if not km.is_alive():
                        os._exit(3)
                    continue
                if msg.get("parent_header", {}).get("msg_id") == msg_id:
                    break
            v = msg["content"].get("user_expressions", {}).get("v", {})
            if v.get("status") == "ok":
                return v.get("data", {}).get("text/plain", "")
        return None

    # The chart and data formatters: a failure only means no charts.
    expression("exec(compile(%r, '<airlock-charts>', 'exec'), {'__name__': 'airlock_charts', 'CHART_MIME': %r, 'DATA_MIME': %r})"
               % (CHARTS, CHART_MIME, DATA_MIME))

    def set_env(rid, env):
        # Returns the values env replaces (None for unset names), or None
        # when the kernel would not take them.
        import ast
        names = sorted(env)
        got = expression("__import__('json').dumps([__import__('os').environ.get(k) for k in %r])" % (names,))
        try:
            old = dict(zip(names, json.loads(ast.literal_eval(got))))
        except (ValueError, SyntaxError, TypeError):
            old = None
        if old is None or expression("__import__('os').environ.update(%r)" % (env,)) is None:
            emit({"id": rid, "t": "error", "name": "EnvError",
                  "value": "the cell's env could not be set; the cell did not run", "traceback": ""})
            return None
        return old

    def restore_env(old):
        expression("[__import__('os').environ.pop(k, None) if v is None else __import__('os').environ.__setitem__(k, v)"
                   " for k, v in %r.items()]" % (old,))

    for rid, code, env in requests():
        cell = Cell(rid)
        old = None
        if env:
            old = set_env(rid, env)
            if old is None:
                emit({"id": rid, "t": "end", "n": 0})
                continue
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
        if old is not None:
            restore_env(old)
        emit({"id": rid, "t": "end", "n": count})


# ---------------------------------------------------------------- bash
def run_bash():
    import secrets
    import shlex
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

    def bash_env_script(path, m, env):
        # ${K[@]@A} is the assignment that recreates K as it is (value,
        # export flag, arrays), or nothing when K is unset: saved in hidden
        # variables before the cell, eval'd after it. Neither forks.
        names = sorted(env)
        # The unset makes the cell's K the plain string given, whatever K
        # was (an array, an integer that would evaluate the value).
        # A readonly K is left alone (assigning it would end the shell):
        # the cell is told on its stderr and sees the context's value.
        ro = 'if [[ ${%s[@]@a} == *r* ]]; then '
        pre = "".join(("__airlock_env_%d=${%s[@]@A}\n" + ro + "echo 'airlock: %s is readonly; the cell keeps its value' >&2; "
                       "else unset -v %s; export %s=%s; fi\n")
                      % (i, k, k, k, k, k, shlex.quote(env[k])) for i, k in enumerate(names))
        post = "".join((ro + ":; else { export -n %s; unset -v %s; eval \"$__airlock_env_%d\"; } 2>/dev/null || :; fi\n")
                       % (k, k, k, i) for i, k in enumerate(names))
        hidden = " ".join("__airlock_env_%d" % i for i in range(len(names)))
        return (pre + "source %s\n__airlock_rc=$?\n" % path + post +
                'printf "%%s%%d\\n" "%s" "$__airlock_rc"\nunset -v __airlock_rc %s\nprintf "%%s0\\n" "%s" >&2\n'
                % (m, hidden, m))

    def send(name, b):
        if b and state["cell"] is not None:
            state["cell"].stream("stdout" if name == "out" else "stderr", b.decode("utf-8", "replace"))

    threading.Thread(target=pump, args=(p.stdout.fileno(), "out", "out"), daemon=True).start()
    threading.Thread(target=pump, args=(p.stderr.fileno(), "err", "err"), daemon=True).start()
    ready()
    n = 0
    for rid, code, env in requests():
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
        if env:
            script = bash_env_script(path, m, env)
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
