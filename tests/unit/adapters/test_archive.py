"""Uploaded adapters' archives are read safely (docs/reference/adapters.md#archives);
the hostile ones are in test_hostile_archives.py."""

from __future__ import annotations

import io
import zipfile

import pytest

from serve_app.adapters.archive import read_archive
from serve_app.adapters.checks import inspect_adapter
from serve_app.contract.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoraSettings
from serve_app.protocol.errors import InvalidRequestError, RequestTooLargeError
from tests.fixtures.adapters import TINY_BASE as TINY
from tests.fixtures.adapters import adapter_files, tarred, zipped

LORA = LoraSettings(max_lora_rank=8, max_loras=2, max_adapter_bytes=64 * 1024)
BOUND = 128 * 1024


@pytest.mark.parametrize("pack", [zipped, tarred, lambda f: zipped(f, prefix="my-adapter/")])
def test_a_peft_adapter_is_read_and_described(pack) -> None:  # type: ignore[no-untyped-def]
    files = read_archive(pack(adapter_files(rank=8, modules=["q_proj", "v_proj"])), BOUND)
    facts = inspect_adapter(files, LORA, TINY, "base")
    assert (facts.rank, facts.target_modules) == (8, ("q_proj", "v_proj"))
    assert set(facts.files) == {ADAPTER_CONFIG, ADAPTER_WEIGHTS}


def test_other_files_are_not_read_but_a_pickled_checkpoint_is_refused() -> None:
    files = {**adapter_files(), "README.md": b"hello"}
    assert set(read_archive(zipped(files), BOUND)) == {ADAPTER_CONFIG, ADAPTER_WEIGHTS}
    pickled = {ADAPTER_CONFIG: adapter_files()[ADAPTER_CONFIG], "adapter_model.bin": b"\x80\x04"}
    with pytest.raises(InvalidRequestError) as caught:
        read_archive(zipped(pickled), BOUND)
    assert caught.value.code == "unsafe_adapter_format"


@pytest.mark.parametrize("name", ["../adapter_config.json", "/abs/adapter_model.safetensors"])
def test_paths_leaving_the_archive_are_refused(name: str) -> None:
    files = {**adapter_files(), name: b"{}"}
    with pytest.raises(InvalidRequestError) as caught:
        read_archive(tarred(files), BOUND)
    assert caught.value.code == "unsafe_archive"


def test_links_are_refused() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        read_archive(tarred(adapter_files(), symlink="adapter_config.json"), BOUND)
    assert caught.value.code == "unsafe_archive"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        link = zipfile.ZipInfo("adapter_model.safetensors")
        link.external_attr = (0o120777) << 16  # a symlink, as `zip --symlinks` stores it
        archive.writestr(link, "/etc/passwd")
        archive.writestr(ADAPTER_CONFIG, adapter_files()[ADAPTER_CONFIG])
    with pytest.raises(InvalidRequestError) as caught:
        read_archive(buffer.getvalue(), BOUND)
    assert caught.value.code == "unsafe_archive"


def test_the_unpacked_size_is_bounded_even_when_a_member_lies() -> None:
    files = adapter_files()
    huge = {**files, ADAPTER_WEIGHTS: files[ADAPTER_WEIGHTS] + bytes(BOUND)}
    with pytest.raises(RequestTooLargeError):
        read_archive(zipped(huge), BOUND)  # compresses to a few KiB; unpacked over the bound
    buffer = io.BytesIO(zipped(huge))
    with zipfile.ZipFile(buffer) as archive:  # declared sizes are not trusted either
        assert any(i.file_size > BOUND for i in archive.infolist())


def test_missing_files_and_non_archives_are_refused() -> None:
    with pytest.raises(InvalidRequestError):
        read_archive(zipped({ADAPTER_CONFIG: b"{}"}), BOUND)
    with pytest.raises(InvalidRequestError):
        read_archive(b"plain bytes, not an archive", BOUND)
