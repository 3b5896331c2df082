"""An uploaded file of a multipart request, as the services read it.

The routes receive Starlette's ``UploadFile`` (spooled: memory up to 1 MiB, then disk)
and hand it on; the services take it by this shape, so none imports the web framework.
"""

from __future__ import annotations

from typing import BinaryIO, Protocol


class Upload(Protocol):
    """The uploaded file: its name and size when the client sent them, the spooled file,
    async reads (a thread once the file is on disk)."""

    @property
    def filename(self) -> str | None: ...

    @property
    def size(self) -> int | None: ...

    @property
    def file(self) -> BinaryIO: ...

    async def seek(self, offset: int) -> None: ...

    async def read(self, size: int = -1) -> bytes: ...


def spooled_size(upload: Upload) -> int:
    """The spooled file's exact size, from its end (blocking: call it in a thread); the
    file is left at its start."""
    upload.file.seek(0, 2)
    size = int(upload.file.tell())
    upload.file.seek(0)
    return size
