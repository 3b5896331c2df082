"""An uploaded PEFT adapter: read from its archive safely, checked before anything loads.

docs/reference/adapters.md#validation. The archive (zip, or tar with any compression
tarfile reads) is read in memory, never extracted to disk: only regular members are
read (links refused), names with ``..`` or an absolute path are refused, and every
read is bounded, so a member that lies about its size cannot inflate past the bound.
Weights must be safetensors: a pickled checkpoint (``.bin``, ``.pt``) is refused,
because loading one runs code. The safetensors header is parsed here (JSON after an
8-byte length), so no tensor library touches the upload.
"""

from __future__ import annotations

import io
import json
import posixpath
import stat
import struct
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from serve_app.contract.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_FILES,
    ADAPTER_WEIGHTS,
    SUPPORTED_TARGET_MODULES,
    LoraSettings,
)
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError

PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_MEMBERS = 64
MAX_CONFIG_BYTES = 64 * 1024
_SAFETENSORS_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})


def _invalid(message: str, code: str = "invalid_adapter") -> InvalidRequestError:
    return InvalidRequestError(message, code=code, param="file")


@dataclass(frozen=True)
class AdapterFacts:
    """What validation learned of an adapter."""

    rank: int
    target_modules: tuple[str, ...]
    files: dict[str, bytes]

    @property
    def bytes(self) -> int:
        return sum(len(data) for data in self.files.values())


def read_archive(data: bytes, max_bytes: int) -> dict[str, bytes]:
    """The adapter's two files from a zip or tar archive; refuses anything unsafe."""
    wanted: dict[str, bytes] = {}
    total = 0
    for name, size, read in _members(data):
        _check_name(name)
        base = posixpath.basename(name)
        if base.lower().endswith(PICKLED_SUFFIXES):
            raise _invalid(
                f"'{base}' is a pickled checkpoint; only safetensors weights are accepted "
                "(loading a pickle runs code). Save the adapter with safe_serialization.",
                code="unsafe_adapter_format",
            )
        if base not in ADAPTER_FILES:
            continue  # a README or training args: not read
        if base in wanted:
            raise _invalid(f"The archive holds '{base}' more than once.")
        if size > max_bytes - total:
            raise _too_large(max_bytes)
        content = read(max_bytes - total + 1)
        total += len(content)
        if total > max_bytes:
            raise _too_large(max_bytes)
        wanted[base] = content
    missing = [name for name in ADAPTER_FILES if name not in wanted]
    if missing:
        raise _invalid(f"The archive lacks {', '.join(missing)} (a PEFT LoRA adapter's files).")
    return wanted


def _too_large(max_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"The adapter is larger than this model's bound of {max_bytes} bytes.", param="file"
    )


def _check_name(name: str) -> None:
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
        raise _invalid(f"Unsafe path in the archive: '{name[:100]}'.", code="unsafe_archive")


_Member = tuple[str, int, Any]


def _members(data: bytes) -> Iterator[_Member]:
    """(name, declared size, bounded reader) of each regular file member."""
    if data[:4] == b"PK\x03\x04":
        yield from _zip_members(data)
        return
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")  # noqa: SIM115 (closed below)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise _invalid("The file is neither a zip nor a tar archive.") from exc
    with archive:
        count = 0
        while True:
            try:
                member = archive.next()
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise _invalid(f"The tar archive is damaged: {exc}") from exc
            if member is None:
                return
            count += 1
            if count > MAX_MEMBERS:
                raise _invalid(f"The archive has more than {MAX_MEMBERS} members.")
            if member.isdir():
                continue
            if not member.isreg():
                raise _invalid(
                    f"'{member.name[:100]}' is a link or special file; archives may hold "
                    "regular files only.",
                    code="unsafe_archive",
                )
            handle = archive.extractfile(member)
            assert handle is not None  # a regular member always has one
            yield member.name, member.size, handle.read


def _zip_members(data: bytes) -> Iterator[_Member]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise _invalid("The zip archive is damaged.") from exc
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_MEMBERS:
            raise _invalid(f"The archive has more than {MAX_MEMBERS} members.")
        for info in infos:
            if info.is_dir():
                continue
            kind = stat.S_IFMT(info.external_attr >> 16)  # unix file type; 0 when unset
            if kind and kind != stat.S_IFREG:
                raise _invalid(
                    f"'{info.filename[:100]}' is a link or special file; archives may hold "
                    "regular files only.",
                    code="unsafe_archive",
                )
            try:
                handle = archive.open(info)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError) as exc:
                raise _invalid(f"'{info.filename[:100]}' cannot be read: {exc}") from exc
            yield info.filename, info.file_size, handle.read


def inspect_adapter(files: dict[str, bytes], lora: LoraSettings) -> AdapterFacts:
    """Check the adapter's config and weights against the head's ``lora`` settings."""
    weights = files[ADAPTER_WEIGHTS]
    if len(weights) > lora.max_adapter_bytes:
        raise _too_large(lora.max_adapter_bytes)
    config = _config(files[ADAPTER_CONFIG])
    modules, ranks = _weights(weights)
    rank = max([_rank(config), *ranks])
    if rank > lora.max_lora_rank:
        raise _invalid(
            f"The adapter's rank {rank} exceeds this model's max_lora_rank {lora.max_lora_rank}.",
            code="adapter_rank_too_large",
        )
    unsupported = sorted(modules - SUPPORTED_TARGET_MODULES)
    if unsupported:
        raise _invalid(
            f"The adapter targets modules this model cannot adapt: {', '.join(unsupported)}; "
            f"supported: {', '.join(sorted(SUPPORTED_TARGET_MODULES))}.",
            code="unsupported_target_modules",
        )
    return AdapterFacts(rank=rank, target_modules=tuple(sorted(modules)), files=dict(files))


def _config(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise _invalid(f"{ADAPTER_CONFIG} is larger than {MAX_CONFIG_BYTES} bytes.")
    try:
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid(f"{ADAPTER_CONFIG} is not JSON.") from exc
    if not isinstance(config, dict):
        raise _invalid(f"{ADAPTER_CONFIG} must be a JSON object.")
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise _invalid(f"Only LoRA adapters are served (peft_type {config.get('peft_type')}).")
    if config.get("use_dora"):
        raise _invalid("DoRA adapters are not served.", code="unsupported_adapter")
    if config.get("modules_to_save"):
        raise _invalid(
            "Adapters with modules_to_save (fully trained layers) are not served.",
            code="unsupported_adapter",
        )
    return config


def _rank(config: dict[str, Any]) -> int:
    given: list[Any] = [config.get("r")]
    pattern = config.get("rank_pattern")
    if isinstance(pattern, dict):
        given.extend(pattern.values())
    ranks = [r for r in given if isinstance(r, int) and not isinstance(r, bool) and r >= 1]
    if len(ranks) != len(given):
        raise _invalid(f"{ADAPTER_CONFIG} needs a positive integer rank 'r'.")
    return max(ranks)


def _weights(data: bytes) -> tuple[set[str], list[int]]:
    """Adapted module names and the ranks the tensors' shapes show."""
    if len(data) < 8:
        raise _invalid(f"{ADAPTER_WEIGHTS} is not a safetensors file.")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(len(data) - 8, 16 * 1024 * 1024):
        raise _invalid(f"{ADAPTER_WEIGHTS} is not a safetensors file.")
    try:
        header = json.loads(data[8 : 8 + header_len])
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid(f"{ADAPTER_WEIGHTS} is not a safetensors file.") from exc
    if not isinstance(header, dict):
        raise _invalid(f"{ADAPTER_WEIGHTS} is not a safetensors file.")
    modules: set[str] = set()
    ranks: list[int] = []
    body = len(data) - 8 - header_len
    for name, info in header.items():
        if name == "__metadata__":
            continue
        _check_tensor(name, info, body)
        parts = name.split(".")
        if "lora_A" not in parts and "lora_B" not in parts:
            raise _invalid(f"Tensor '{name[:100]}' is not a LoRA weight.")
        kind = "lora_A" if "lora_A" in parts else "lora_B"
        modules.add(parts[parts.index(kind) - 1])
        shape = info["shape"]
        ranks.append(int(shape[0] if kind == "lora_A" else shape[-1]))
    if not modules:
        raise _invalid(f"{ADAPTER_WEIGHTS} holds no LoRA weights.")
    return modules, ranks


def _check_tensor(name: str, info: Any, body: int) -> None:
    ok = (
        isinstance(info, dict)
        and info.get("dtype") in _SAFETENSORS_DTYPES
        and isinstance(info.get("shape"), list)
        and len(info["shape"]) == 2
        and all(isinstance(d, int) and d >= 1 for d in info["shape"])
        and isinstance(info.get("data_offsets"), list)
        and len(info["data_offsets"]) == 2
        and 0 <= info["data_offsets"][0] <= info["data_offsets"][1] <= body
    )
    if not ok:
        raise _invalid(f"Tensor '{name[:100]}' of {ADAPTER_WEIGHTS} is malformed.")
