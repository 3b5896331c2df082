"""A scripted engine that refuses to start with chosen settings: a boot failure on demand.

Dedicated endpoints roll a failed redeploy back; to exercise that on a real
Ray Serve, ``config["fail_start_with"]`` names engine settings (e.g.
``{"max_num_seqs": 3}``) with which ``start`` raises, as a real engine does when
a setting does not fit the hardware.
"""

from __future__ import annotations

from deployments.chat.base import EngineInfo
from tests.fakes.scripted_engine import ScriptedEngine


class BootCheckedEngine(ScriptedEngine):
    async def start(self) -> EngineInfo:
        for key, value in dict(self.config.get("fail_start_with") or {}).items():
            if self.config.get(key) == value:
                raise RuntimeError(f"engine cannot start with {key}={value}")
        return await super().start()
