"""MP4 (H.264) encoding of generated frames with FFmpeg's libx264, through PyAV.

PyAV's wheel ships FFmpeg with libx264, so no system encoder is needed. The
file is written with ``movflags=+faststart`` (the index before the media) so a
browser or player can start playing a presigned URL before the download ends;
that second pass needs a seekable real file, hence a temporary folder rather
than an in-memory buffer. ``yuv420p`` is what every player decodes; it needs
even dimensions, so an odd edge is padded by repeating the last row/column.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

logger = logging.getLogger(__name__)

MP4_CONTENT_TYPE = "video/mp4"


def _even(frames: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    import numpy as np

    _, height, width, _ = frames.shape
    pad_h, pad_w = height % 2, width % 2
    if not (pad_h or pad_w):
        return frames
    return np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")


def encode_mp4(
    frames: npt.NDArray[np.uint8], fps: int, *, crf: int = 20, preset: str = "veryfast"
) -> bytes:
    """An H.264 MP4 of RGB ``uint8`` frames ``(n, height, width, 3)`` at ``fps``."""
    import av

    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"expected RGB frames (n, h, w, 3), got shape {frames.shape}")
    frames = _even(frames)
    with tempfile.TemporaryDirectory(prefix="video-") as folder:
        path = Path(folder) / "video.mp4"
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as out:
            stream = out.add_stream("libx264", rate=fps)
            stream.width = int(frames.shape[2])
            stream.height = int(frames.shape[1])
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(crf), "preset": preset}
            for frame in frames:
                picture = av.VideoFrame.from_ndarray(frame, format="rgb24")
                for packet in stream.encode(picture):
                    out.mux(packet)
            for packet in stream.encode():  # flush the encoder's delayed frames
                out.mux(packet)
        data = path.read_bytes()
    logger.debug("encoded %d frames at %d fps into %d bytes", len(frames), fps, len(data))
    return data
