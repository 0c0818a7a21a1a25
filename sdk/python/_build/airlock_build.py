"""The package's PEP 517 build backend, on the standard library alone.

``pip install ./sdk/python`` then needs nothing that is not already there:
no setuptools, no wheel, no index (a build environment with no
requirements is made offline). It builds a pure-Python wheel of the
``airlock`` package (and an sdist, and an editable wheel for ``pip install
-e``) with the metadata of pyproject.toml's ``[project]`` table, of which it
reads the keys this project uses: name, version, description, readme,
requires-python and classifiers (strings and lists of strings).
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "airlock"
#: a fixed time for the archives' entries, so builds are reproducible
_EPOCH = (2026, 1, 1, 0, 0, 0)

_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _project() -> Dict[str, Any]:
    """The [project] table's string and list-of-string keys."""
    out: Dict[str, Any] = {}
    section = ""
    key: Optional[str] = None
    items: List[str] = []
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip() if '"' not in raw else raw.strip()
            if key is not None:  # inside a multi-line list
                items += _STR.findall(line)
                if line.startswith("]") or line.endswith("]"):
                    out[key], key = items, None
                continue
            if not line:
                continue
            m = re.match(r"^\[([^\]]+)\]$", line)
            if m:
                section = m.group(1).strip()
                continue
            if section != "project":
                continue
            m = re.match(r"^([A-Za-z0-9_-]+)\s*=\s*(.*)$", line)
            if not m:
                continue
            k, v = m.group(1), m.group(2).strip()
            if v.startswith("["):
                items = _STR.findall(v)
                if v.endswith("]"):
                    out[k] = items
                else:
                    key = k
            else:
                s = _STR.match(v)
                if s:
                    out[k] = s.group(1)
    for need in ("name", "version"):
        if need not in out:
            raise RuntimeError("pyproject.toml [project] has no %s" % need)
    return out


def _dist(meta: Dict[str, Any]) -> str:
    return re.sub(r"[-_.]+", "_", meta["name"]).lower()


def _metadata(meta: Dict[str, Any]) -> str:
    lines = ["Metadata-Version: 2.1", "Name: " + meta["name"], "Version: " + meta["version"]]
    if meta.get("description"):
        lines.append("Summary: " + meta["description"])
    if meta.get("requires-python"):
        lines.append("Requires-Python: " + meta["requires-python"])
    for c in meta.get("classifiers", []):
        lines.append("Classifier: " + c)
    body = ""
    readme = meta.get("readme")
    if readme:
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


_WHEEL = "Wheel-Version: 1.0\nGenerator: airlock_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, file path) of the package's files."""
    out = []
    top = os.path.join(ROOT, PACKAGE)
    for d, dirs, files in os.walk(top):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py") or name == "py.typed":
                p = os.path.join(d, name)
                out.append((os.path.relpath(p, ROOT).replace(os.sep, "/"), p))
    return out


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def _write_wheel(wheel_directory: str, entries: List[Tuple[str, bytes]], meta: Dict[str, Any]) -> str:
    dist = _dist(meta)
    info = "%s-%s.dist-info" % (dist, meta["version"])
    entries = entries + [
        (info + "/METADATA", _metadata(meta).encode("utf-8")),
        (info + "/WHEEL", _WHEEL.encode("utf-8")),
        (info + "/top_level.txt", (PACKAGE + "\n").encode("utf-8")),
    ]
    record = "".join("%s,%s,%d\n" % (n, _digest(b), len(b)) for n, b in entries) + info + "/RECORD,,\n"
    entries.append((info + "/RECORD", record.encode("utf-8")))
    name = "%s-%s-py3-none-any.whl" % (dist, meta["version"])
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in entries:
            zi = zipfile.ZipInfo(n, _EPOCH)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, b)
    return name


def _read(p: str) -> bytes:
    with open(p, "rb") as f:
        return f.read()


# -- PEP 517 ------------------------------------------------------------------


def get_requires_for_build_wheel(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Any = None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings: Any = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Any = None) -> str:
    meta = _project()
    info = "%s-%s.dist-info" % (_dist(meta), meta["version"])
    d = os.path.join(metadata_directory, info)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata(meta))
    with open(os.path.join(d, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_WHEEL)
    return info


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Any = None, metadata_directory: Optional[str] = None) -> str:
    meta = _project()
    return _write_wheel(wheel_directory, [(n, _read(p)) for n, p in _package_files()], meta)


def build_editable(wheel_directory: str, config_settings: Any = None, metadata_directory: Optional[str] = None) -> str:
    """A wheel whose .pth file puts this directory on sys.path (PEP 660)."""
    meta = _project()
    pth = ("__editable__.%s.pth" % _dist(meta), (ROOT + "\n").encode("utf-8"))
    return _write_wheel(wheel_directory, [pth], meta)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    meta = _project()
    base = "%s-%s" % (_dist(meta), meta["version"])
    files = [("pyproject.toml", os.path.join(ROOT, "pyproject.toml")), ("_build/airlock_build.py", os.path.abspath(__file__))]
    if meta.get("readme"):
        files.append((meta["readme"], os.path.join(ROOT, meta["readme"])))
    files += _package_files()
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        def add(arc: str, data: bytes) -> None:
            ti = tarfile.TarInfo(base + "/" + arc)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1767225600
            t.addfile(ti, io.BytesIO(data))

        add("PKG-INFO", _metadata(meta).encode("utf-8"))
        for arc, p in files:
            add(arc, _read(p))
    return name
