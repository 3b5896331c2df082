"""No upload can blow up a replica (docs/reference/adapters.md#archives): hostile archives
of at most 1 MiB are refused with a 400, and reading one raises the reading process's
peak RSS by under 64 MiB and takes under 2 s of its CPU (measured in a child process,
with the real bound of a default ``lora`` block)."""

from __future__ import annotations

import bz2
import io
import json
import lzma
import subprocess
import sys
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from serve_app.adapters.archive import read_archive
from serve_app.adapters.service import UPLOAD_OVERHEAD_BYTES
from serve_app.contract.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraSettings
from serve_app.protocol.errors import InvalidRequestError
from tests.fixtures.adapters import adapter_files, tarred, zipped

LIMIT = LoraSettings().max_adapter_bytes + UPLOAD_OVERHEAD_BYTES
"""What the gateway allows a default ``lora`` head's upload: 64 MiB and change."""
BOMB = 128 * 1024 * 1024
"""Bytes a bomb unpacks to (what tarfile used to read in one call)."""
MiB = 1024 * 1024


def _compress(kind: str, head: bytes, zeros: int, tail: bytes = b"") -> bytes:
    """``head`` + ``zeros`` zero bytes + ``tail``, compressed as ``kind``, in 1 MiB steps."""
    compressor: object
    if kind == "bz2":
        compressor = bz2.BZ2Compressor(9)
    elif kind == "xz":
        compressor = lzma.LZMACompressor(preset=0)
    else:
        compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    out = [compressor.compress(head)]  # type: ignore[attr-defined]
    block = bytes(MiB)
    for _ in range(zeros // MiB):
        out.append(compressor.compress(block))  # type: ignore[attr-defined]
    out.append(compressor.compress(tail))  # type: ignore[attr-defined]
    out.append(compressor.flush())  # type: ignore[attr-defined]
    return b"".join(out)


def _header(name: str, kind: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    return info.tobuf(tarfile.USTAR_FORMAT)


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _many_members_tar() -> bytes:
    return _gz(_tar([(f"f{i}", b"") for i in range(5000)]))


def _gz(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    return compressor.compress(data) + compressor.flush()


def _zip_of(members: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return buffer.getvalue()


def _zip_bomb() -> bytes:
    """A deflated weights member of 128 MiB of zeros (declared honestly)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        archive.writestr(ADAPTER_CONFIG, adapter_files()[ADAPTER_CONFIG])
        with archive.open(ADAPTER_WEIGHTS, "w", force_zip64=False) as handle:
            block = bytes(MiB)
            for _ in range(BOMB // MiB):
                handle.write(block)
    return buffer.getvalue()


def _pax_chain() -> bytes:
    headers = b"".join(_header(f"p{i}", tarfile.XHDTYPE, 0) for i in range(2000))
    return _gz(headers + bytes(1024))


def _pax_records() -> bytes:
    """A pax header of 900 KiB of distinct records (tarfile makes objects of each)."""
    records = b"".join(b"%d k%06d=v\n" % (len(b"k000000=v\n") + 3, i) for i in range(80_000))
    head = _header("pax", tarfile.XHDTYPE, len(records))
    return _gz(head + records + bytes(-len(records) % 512) + bytes(1024))


def _gzip_streams() -> bytes:
    return _gz(b"") * 5000


HOSTILE: dict[str, Callable[[], bytes]] = {
    "pax-size-bz2": lambda: _compress("bz2", _header("p", tarfile.XHDTYPE, BOMB), BOMB),
    "pax-size-xz": lambda: _compress("xz", _header("p", tarfile.XHDTYPE, BOMB), BOMB),
    "gnu-longname-gz": lambda: _compress("gz", _header("L", tarfile.GNUTYPE_LONGNAME, BOMB), BOMB),
    "skipped-member-bz2": lambda: _compress("bz2", _header("junk", tarfile.REGTYPE, BOMB), BOMB),
    "weights-bomb-xz": lambda: _compress(
        "xz", _header(ADAPTER_WEIGHTS, tarfile.REGTYPE, BOMB), BOMB
    ),
    "bz2-of-zeros": lambda: _compress("bz2", b"", BOMB),
    "zip-bomb": _zip_bomb,
    "tar-5000-members": _many_members_tar,
    "zip-5000-members": lambda: _zip_of([(f"f{i}", b"") for i in range(5000)]),
    "pax-chain": _pax_chain,
    "pax-records": _pax_records,
    "gzip-5000-streams": _gzip_streams,
    "zip-bzip2-member": lambda: zipped_with(zipfile.ZIP_BZIP2),
    "nested-tar-in-tar": lambda: _gz(_tar([("inner.tar.gz", tarred(adapter_files()))])),
    "nested-zip-in-zip": lambda: _zip_of([("inner.zip", zipped(adapter_files()))]),
    "truncated-gzip": lambda: tarred(adapter_files())[:-40],
}


def zipped_with(method: int) -> bytes:
    return _zip_of(list(adapter_files().items()), method)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each hostile archive in a file (built once: the bombs take a few seconds)."""
    folder = tmp_path_factory.mktemp("hostile")
    paths = {}
    for name, build in HOSTILE.items():
        data = build()
        assert len(data) <= MiB, (name, len(data))
        paths[name] = folder / name
        paths[name].write_bytes(data)
    return paths


@pytest.mark.parametrize("name", list(HOSTILE))
def test_each_hostile_archive_is_refused_with_a_400(hostile: dict[str, Path], name: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        read_archive(hostile[name].read_bytes(), LIMIT)
    assert caught.value.status_code == 400
    assert caught.value.code in ("unsafe_archive", "invalid_adapter"), caught.value.message


_CHILD = """
import json, os, resource, sys
from serve_app.adapters.archive import read_archive
from serve_app.protocol.errors import GatewayError

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def measure(path, limit):
    data = open(path, "rb").read()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # the peak RSS (VmHWM) starts again from the current RSS
    before, usage = status("VmRSS"), resource.getrusage(resource.RUSAGE_SELF)
    try:
        read_archive(data, limit)
        code = None
    except GatewayError as err:
        code = err.code
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    return {"code": code, "rss_rise": status("VmHWM") - before, "cpu": cpu}

results = {}
for path in sys.argv[2:]:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # each archive in a fresh copy of this process
        os.write(write, json.dumps(measure(path, int(sys.argv[1]))).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        results[os.path.basename(path)] = json.loads(pipe.read())
    os.waitpid(child, 0)
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def measured(hostile: dict[str, Path]) -> dict[str, dict[str, object]]:
    """Each hostile archive read in a forked copy of one child process: its peak RSS
    above its RSS before the read, and the CPU seconds the read took."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(LIMIT), *map(str, hostile.values())],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=True,
    )
    results: dict[str, dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


@pytest.mark.parametrize("name", list(HOSTILE))
def test_reading_one_costs_under_64_mib_and_2_cpu_seconds(
    measured: dict[str, dict[str, float]], name: str
) -> None:
    result = measured[name]
    assert result["code"] in ("unsafe_archive", "invalid_adapter"), result
    assert result["rss_rise"] < 64 * MiB, result
    assert result["cpu"] < 2.0, result
