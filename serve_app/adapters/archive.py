"""An uploaded adapter's archive, read so that no upload can exhaust a replica.

docs/reference/adapters.md#archives. What is accepted is a safe subset:

- zip, its members stored or deflated (bzip2 and lzma members are refused: zipfile
  decompresses those without an output bound), no zip64, a central directory of at most
  ``MAX_ZIP_DIRECTORY_BYTES`` and ``MAX_MEMBERS`` entries, checked on the end record
  before ``zipfile`` parses the directory;
- tar, plain or compressed with gzip, bzip2 or xz: the compression is undone here first,
  in bounded steps (``max_length``) into at most ``unpacked_cap`` bytes, so ``tarfile``
  only ever parses bytes in memory that are already bounded (it never reads a
  decompressing stream: a pax header declaring a huge size, or a skipped member, cannot
  make it inflate more); headers are checked as ``tarfile`` meets them
  (``_SafeTarInfo``): pax and GNU long-name headers of at most ``MAX_META_BYTES``, no
  sparse members, at most ``MAX_MEMBERS`` members.

Unpacked bytes are bounded twice: by the base model's bound (``max_bytes``: 413 over it),
and by ``UNPACK_RATIO`` times the upload with a floor of ``UNPACK_FLOOR_BYTES`` (400
``unsafe_archive`` over it: adapters' weights barely compress, bombs do). The archive is
never extracted to disk; only regular members are read (links refused), names with ``..``
or an absolute path are refused, and only the adapter's two files are read at all.
Weights must be safetensors: a pickled checkpoint (``.bin``, ``.pt``) is refused.
"""

from __future__ import annotations

import bz2
import io
import lzma
import posixpath
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from serve_app.contract.adapters import ADAPTER_FILES
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError

PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_MEMBERS = 64
"""Entries of an archive (folders included)."""
MAX_META_BYTES = 8 * 1024
"""Largest pax or GNU long-name header: enough for any path, too small to bloat."""
MAX_META_RUN = 4
"""Pax/long-name headers before one member (tarfile reads them recursively)."""
MAX_ZIP_DIRECTORY_BYTES = 256 * 1024
MAX_STREAMS = 16
"""Concatenated gzip/bzip2/xz streams in one upload."""
UNPACK_RATIO = 8
UNPACK_FLOOR_BYTES = 8 * 1024 * 1024
XZ_MEMLIMIT = 96 * 1024 * 1024
"""liblzma's own bound: xz presets up to -8 (a 32 MiB dictionary) decode within it."""
_CHUNK = 1024 * 1024
_ZIP_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})
_META_TYPES = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)
_COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


def _invalid(message: str, code: str = "invalid_adapter") -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param="file")


def _unsafe(message: str) -> InvalidRequestError:
    return _invalid(message, code="unsafe_archive")


def _too_large(max_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"The adapter is larger than this model's bound of {max_bytes} bytes.", param="file"
    )


class _Budget:
    """The unpacked bytes an upload may take: ``max_bytes`` (413 past it) and the ratio
    cap (400 ``unsafe_archive`` past it, when that is the smaller)."""

    def __init__(self, upload_bytes: int, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.ratio_cap = max(UNPACK_FLOOR_BYTES, UNPACK_RATIO * upload_bytes)
        self.cap = min(max_bytes, self.ratio_cap)

    def refuse(self) -> Exception:
        if self.cap == self.max_bytes:
            return _too_large(self.max_bytes)
        return _unsafe(
            f"The archive unpacks to more than {UNPACK_RATIO} times its size "
            f"(and more than {UNPACK_FLOOR_BYTES} bytes): refused as a decompression bomb."
        )


def read_archive(data: bytes, max_bytes: int) -> dict[str, bytes]:
    """The adapter's two files from a zip or tar archive; refuses anything unsafe.

    Blocking and CPU-bound (call it in a thread); its memory stays within a few times
    ``_Budget.cap`` whatever the upload holds."""
    budget = _Budget(len(data), max_bytes)
    wanted: dict[str, bytes] = {}
    total = 0
    for name, size, read in _members(data, budget):
        _check_name(name)
        base = posixpath.basename(name)
        if base.lower().endswith(PICKLED_SUFFIXES):
            raise _invalid(
                f"'{base[:100]}' is a pickled checkpoint; only safetensors weights are "
                "accepted (loading a pickle runs code). Save the adapter with "
                "safe_serialization.",
                code="unsafe_adapter_format",
            )
        if base not in ADAPTER_FILES:
            continue  # a README or training args: not read
        if base in wanted:
            raise _invalid(f"The archive holds '{base}' more than once.")
        if size > budget.cap - total:
            raise budget.refuse()
        content = read(budget.cap - total + 1)
        total += len(content)
        if total > budget.cap:
            raise budget.refuse()
        wanted[base] = content
    missing = [name for name in ADAPTER_FILES if name not in wanted]
    if missing:
        raise _invalid(f"The archive lacks {', '.join(missing)} (a PEFT LoRA adapter's files).")
    return wanted


def _check_name(name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0] or "\0" in name:
        raise _unsafe(f"Unsafe path in the archive: '{name[:100]}'.")


_Member = tuple[str, int, Callable[[int], bytes]]


def _members(data: bytes, budget: _Budget) -> Iterator[_Member]:
    """(name, declared size, bounded reader) of each regular file member."""
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        yield from _zip_members(data)
        return
    for magic, kind in _COMPRESSED:
        if data.startswith(magic):
            data = _inflate(data, kind, budget)
            break
    yield from _tar_members(data)


# ---- compressed tar: undone here, bounded -------------------------------------------------
def _decompressor(kind: str) -> Any:
    if kind == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if kind == "bzip2":
        return bz2.BZ2Decompressor()
    return lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)


def _inflate(data: bytes, kind: str, budget: _Budget) -> bytes:
    """The whole decompressed stream(s), never more than ``budget.cap`` bytes: each step
    asks for at most ``_CHUNK`` bytes of output, so one call cannot inflate a bomb."""
    out: list[bytes] = []
    total = 0
    rest = data
    for _ in range(MAX_STREAMS):
        step = _decompressor(kind)
        try:
            for chunk in _steps(step, rest, kind):
                total += len(chunk)
                if total > budget.cap:
                    raise budget.refuse()
                out.append(chunk)
        except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
            raise _invalid(f"The {kind} stream is damaged: {str(exc)[:200]}") from exc
        if not step.eof:
            raise _invalid(f"The {kind} stream is truncated.")
        rest = step.unused_data.lstrip(b"\0")  # zero padding after a stream is allowed
        if not rest:
            return b"".join(out)
    raise _unsafe(f"The archive holds more than {MAX_STREAMS} {kind} streams.")


def _steps(step: Any, data: bytes, kind: str) -> Iterator[bytes]:
    """One stream's output in pieces of at most ``_CHUNK`` bytes."""
    if kind == "gzip":
        chunk = step.decompress(data, _CHUNK)
        while True:
            yield chunk
            if step.eof or (not chunk and not step.unconsumed_tail):
                return
            chunk = step.decompress(step.unconsumed_tail, _CHUNK)
    chunk = step.decompress(data, _CHUNK)
    while True:
        yield chunk
        if step.eof or step.needs_input:
            return
        chunk = step.decompress(b"", _CHUNK)


# ---- tar ----------------------------------------------------------------------------------
class _SafeTarInfo(tarfile.TarInfo):
    """``tarfile``'s header, checked before ``tarfile`` acts on it: it reads a pax or
    long-name header's data in one call and parses every record into objects, and it
    follows a chain of them recursively."""

    def _proc_member(self, archive: Any) -> Any:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise _unsafe("Sparse tar members are not accepted.")
        if self.type in _META_TYPES:
            if self.size > MAX_META_BYTES:
                raise _unsafe(
                    f"A tar extended header declares {self.size} bytes (at most {MAX_META_BYTES})."
                )
            run = getattr(archive, "_gateway_meta_run", 0) + 1
            if run > MAX_META_RUN:
                raise _unsafe("Too many tar extended headers in a row.")
            archive._gateway_meta_run = run
            if b"GNU.sparse" in _peek(archive.fileobj, self.size):
                raise _unsafe("Sparse tar members are not accepted.")
        else:
            archive._gateway_meta_run = 0
        return super()._proc_member(archive)  # type: ignore[misc]  # private in typeshed


def _peek(fileobj: Any, size: int) -> bytes:
    where = fileobj.tell()
    try:
        return bytes(fileobj.read(size))
    finally:
        fileobj.seek(where)


def _tar_members(data: bytes) -> Iterator[_Member]:
    try:
        archive = tarfile.TarFile(fileobj=io.BytesIO(data), mode="r", tarinfo=_SafeTarInfo)
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError) as exc:
        raise _invalid("The file is neither a zip nor a tar archive.") from exc
    with archive:
        for count in range(1, MAX_MEMBERS + 2):
            try:
                member = archive.next()
            except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError) as exc:
                raise _invalid(f"The tar archive is damaged: {str(exc)[:200]}") from exc
            if member is None:
                return
            if count > MAX_MEMBERS:
                raise _unsafe(f"The archive has more than {MAX_MEMBERS} members.")
            if member.isdir():
                continue
            if not member.isreg():
                raise _unsafe(
                    f"'{member.name[:100]}' is a link or special file; archives may hold "
                    "regular files only."
                )
            handle = archive.extractfile(member)
            assert handle is not None  # a regular member always has one
            yield member.name, member.size, handle.read


# ---- zip ----------------------------------------------------------------------------------
def _check_zip_directory(data: bytes) -> None:
    """Bound the central directory before ``zipfile`` parses it (it reads the size the
    end record declares and makes an object per entry)."""
    end = zipfile._EndRecData(io.BytesIO(data))  # type: ignore[attr-defined]
    if end is None:
        raise _invalid("The zip archive is damaged.")
    entries = end[zipfile._ECD_ENTRIES_TOTAL]  # type: ignore[attr-defined]
    size = end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    if entries > MAX_MEMBERS:
        raise _unsafe(f"The archive has more than {MAX_MEMBERS} members.")
    if size > MAX_ZIP_DIRECTORY_BYTES:
        raise _unsafe(f"The zip directory is larger than {MAX_ZIP_DIRECTORY_BYTES} bytes.")
    where = end[zipfile._ECD_LOCATION]  # type: ignore[attr-defined]
    if data[max(0, where - 20) : where - 16] == b"PK\x06\x07":  # zip64's locator
        raise _unsafe("zip64 archives are not accepted.")


def _zip_members(data: bytes) -> Iterator[_Member]:
    try:
        _check_zip_directory(data)
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise _invalid("The zip archive is damaged.") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise _unsafe(f"The archive has more than {MAX_MEMBERS} members.")
        for info in infos:
            if info.is_dir():
                continue
            kind = stat.S_IFMT(info.external_attr >> 16)  # unix file type; 0 when unset
            if kind and kind != stat.S_IFREG:
                raise _unsafe(
                    f"'{info.filename[:100]}' is a link or special file; archives may hold "
                    "regular files only."
                )
            if info.compress_type not in _ZIP_METHODS:
                raise _unsafe(
                    f"'{info.filename[:100]}' uses zip compression method "
                    f"{info.compress_type}; only stored and deflated members are accepted."
                )
            yield info.filename, info.file_size, _zip_reader(archive, info)


def _zip_reader(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[int], bytes]:
    def read(limit: int) -> bytes:
        try:
            with archive.open(info) as handle:
                return handle.read(limit)
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError) as exc:
            raise _invalid(f"'{info.filename[:100]}' cannot be read: {exc}") from exc
        except (zlib.error, EOFError, ValueError) as exc:
            raise _invalid(f"'{info.filename[:100]}' is damaged: {exc}") from exc

    return read
