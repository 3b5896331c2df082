"""``/api/adapters`` and the resolution of ``<base>:<adapter>`` model ids.

docs/reference/adapters.md. An organization's adapters are visible to that
organization only: another organization's adapter, like a missing one, answers 404
``model_not_found`` when named as a model and 404 ``adapter_not_found`` on
``/api/adapters/{name}``. Operator adapters (the catalog's) are visible to all.
Uploads are validated completely before anything is stored: the archive read within
bounds (``archive``), the adapter checked against its base model's layers as the base
model's head describes them (``checks``); the files (the weights, and a config written
from the checked facts) go to the object store, then the row to SQL. Blocking calls run
in threads, off the replica's event loop.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping
from typing import Protocol

from serve_app.adapters.archive import read_archive
from serve_app.adapters.checks import MAX_CONFIG_BYTES, inspect_adapter
from serve_app.adapters.store import AdapterRecord, AdapterStore, new_adapter_id, object_prefix
from serve_app.auth.principal import ROLE_ADMIN, Principal
from serve_app.catalog.catalog import Catalog, adapter_card, adapter_pricing, lora_settings
from serve_app.catalog.config import AdapterModel, CatalogModel
from serve_app.contract.adapters import (
    ADAPTER_CONFIG,
    ADAPTER_FILES,
    ADAPTER_WEIGHTS,
    NAME_PATTERN,
    RESERVED_NAMES,
    AdapterRef,
    BaseShapes,
    LoraSettings,
)
from serve_app.protocol.adapters import AdapterDeleted, AdapterList, AdapterObject
from serve_app.protocol.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    RequestTooLargeError,
    model_not_found,
)
from serve_app.protocol.models import ModelCard
from serve_app.protocol.uploads import Upload
from serve_app.storage.objects import ObjectStore
from serve_app.storage.quotas import StorageQuotas
from serve_app.storage.schema import utcnow

logger = logging.getLogger(__name__)

MAX_ADAPTERS_PER_ORG = 100
UPLOAD_OVERHEAD_BYTES = MAX_CONFIG_BYTES + 64 * 1024
"""An archive's room beyond the weights bound: the config and the archive's own framing."""


class AdapterHead(Protocol):
    """A chat head that can drop a deleted adapter (``RayHeadClient``, ``LocalHeadClient``)."""

    async def forget_adapter(self, key: str) -> bool: ...

    async def adapter_base(self) -> BaseShapes | None: ...


def adapter_not_found(name: str) -> NotFoundError:
    shown = name if len(name) <= 64 else f"{name[:64]}..."
    return NotFoundError(f"No such adapter: {shown}", code="adapter_not_found", param="name")


def record_ref(record: AdapterRecord) -> AdapterRef:
    """What a head needs to load an uploaded adapter."""
    return AdapterRef(
        key=record.id,
        model_id=f"{record.base_model}:{record.name}",
        objects=tuple((name, f"{record.object_prefix}/{name}") for name in ADAPTER_FILES),
    )


def _object(record: AdapterRecord) -> AdapterObject:
    return AdapterObject(
        id=record.id,
        name=record.name,
        model=f"{record.base_model}:{record.name}",
        base_model=record.base_model,
        source="organization",
        rank=record.rank,
        target_modules=record.target_modules.split(","),
        bytes=record.bytes,
        sha256=record.sha256,
        created_at=int(record.created_at.timestamp()),
    )


def _operator_object(model: AdapterModel, description: str | None) -> AdapterObject:
    return AdapterObject(
        id=model.ref.key,
        name=model.id.rpartition(":")[2],
        model=model.id,
        base_model=model.base_id,
        source="catalog",
        description=description,
    )


class AdapterService:
    """Every organization's adapters: SQL rows, files in the object store."""

    def __init__(
        self,
        catalog: Catalog,
        store: AdapterStore,
        objects: ObjectStore,
        heads: Mapping[str, object] | None = None,
        *,
        quotas: StorageQuotas,
    ) -> None:
        """``heads``: the chat heads' clients by model id; a deleted adapter is dropped
        from its base model's head through them. ``quotas``: the organization's stored
        bytes and objects, adapters included."""
        self.catalog = catalog
        self.store = store
        self.objects = objects
        self.heads = heads or {}
        self.quotas = quotas
        self._bases: dict[str, BaseShapes] = {}
        """Base model id -> its layers, as its head described them (they never change
        under one deployment)."""

    def max_upload_bytes(self) -> int:
        """The largest upload any head's bound allows (the route's body limit)."""
        bounds = [s.max_adapter_bytes for m in self.catalog if (s := lora_settings(m))]
        return max(bounds, default=0) + UPLOAD_OVERHEAD_BYTES

    # ---- resolution ---------------------------------------------------------------
    async def resolve(self, model_id: str, principal: Principal) -> AdapterModel | None:
        """The organization's or the catalog's adapter named by ``model_id``; None where
        ``model_id`` names no adapter of a model serving adapters (the catalog decides)."""
        base = self.catalog.adapter_base(model_id)
        if base is None:
            return None
        operator = self.catalog.operator_adapter(model_id)
        if operator is not None:
            return operator
        return await asyncio.to_thread(self._own_adapter, base, model_id, principal)

    def resolve_blocking(self, model_id: str, principal: Principal) -> AdapterModel | None:
        """``resolve`` for callers off the event loop (a batch file's validation, in a
        thread): the same answers, the store read in the calling thread."""
        base = self.catalog.adapter_base(model_id)
        if base is None:
            return None
        operator = self.catalog.operator_adapter(model_id)
        if operator is not None:
            return operator
        return self._own_adapter(base, model_id, principal)

    def _own_adapter(self, base: CatalogModel, model_id: str, principal: Principal) -> AdapterModel:
        """The caller's organization's adapter ``<base>:<name>`` (blocking: SQL)."""
        name = model_id.rpartition(":")[2]
        record = self.store.get(principal.org_id, name)
        if record is None or record.base_model != base.id:
            raise model_not_found(model_id)  # another org's adapter reads the same
        own = None
        if record.input_per_mtok is not None and record.output_per_mtok is not None:
            own = (record.input_per_mtok, record.output_per_mtok)
        pricing = adapter_pricing(base.pricing, own)
        return AdapterModel.of(base, record_ref(record), pricing, owner_org=principal.org_id)

    async def cards(self, principal: Principal) -> list[ModelCard]:
        """The organization's adapters as ``/v1/models`` entries (bases still served)."""
        records = await asyncio.to_thread(self.store.list, principal.org_id)
        cards = []
        for record in records:
            base = self.catalog.get(record.base_model)
            if base is not None and lora_settings(base) is not None:
                model = AdapterModel.of(base, record_ref(record), owner_org=principal.org_id)
                cards.append(adapter_card(model))
        return cards

    # ---- /api/adapters ------------------------------------------------------------
    async def upload(
        self, upload: Upload, name: str, base_model: str, principal: Principal
    ) -> AdapterObject:
        _require_admin(principal)
        base, lora = self._upload_target(name, base_model)
        shapes = await self._base_shapes(base.id)
        limit = lora.max_adapter_bytes + UPLOAD_OVERHEAD_BYTES
        data = await upload.read(limit + 1)
        if len(data) > limit:
            raise RequestTooLargeError(
                f"The adapter archive is larger than {limit} bytes.", param="file"
            )
        files = await asyncio.to_thread(read_archive, data, limit)
        del data
        facts = await asyncio.to_thread(inspect_adapter, files, lora, shapes, base.id)
        if self.catalog.operator_adapter(f"{base.id}:{name}") is not None:
            raise _name_taken(name)
        if await asyncio.to_thread(self.store.count, principal.org_id) >= MAX_ADAPTERS_PER_ORG:
            raise InvalidRequestError(
                f"An organization may hold at most {MAX_ADAPTERS_PER_ORG} adapters.",
                code="adapter_limit_reached",
            )
        adapter_id = new_adapter_id()
        record = AdapterRecord(
            id=adapter_id,
            org_id=principal.org_id,
            user_id=principal.user_id,
            name=name,
            base_model=base.id,
            rank=facts.rank,
            target_modules=",".join(facts.target_modules),
            bytes=facts.bytes,
            sha256=hashlib.sha256(facts.files[ADAPTER_WEIGHTS]).hexdigest(),
            object_prefix=object_prefix(adapter_id),
            input_per_mtok=None,
            output_per_mtok=None,
            created_at=utcnow(),
        )
        inserted = await asyncio.to_thread(
            self.quotas.store,  # the organization's stored bytes and objects are bounded
            principal.org_id,
            record.bytes,
            put=lambda: self._put_files(record, facts.files),
            insert=lambda conn: self.store.insert_in(conn, record),
            undo=lambda: self._delete_files(record),
        )
        if not inserted:
            await asyncio.to_thread(self._delete_files, record)
            raise _name_taken(name)
        return _object(record)

    def _upload_target(self, name: str, base_model: str) -> tuple[CatalogModel, LoraSettings]:
        if not NAME_PATTERN.fullmatch(name) or name in RESERVED_NAMES:
            raise InvalidRequestError(
                "Invalid adapter name: 1-64 characters of a-z, 0-9, '.', '_' and '-', "
                "starting with a letter or digit.",
                code="invalid_value",
                param="name",
            )
        base = self.catalog.get(base_model)
        if base is None or base.is_external or base.id != base_model:
            raise model_not_found(base_model)
        lora = lora_settings(base)
        if lora is None:
            raise InvalidRequestError(
                f"The model '{base.id}' does not serve LoRA adapters.",
                code="adapters_not_supported",
                param="base_model",
            )
        return base, lora

    async def _base_shapes(self, base_id: str) -> BaseShapes:
        """The base model's layers, asked of its head once (a head warming up answers
        the upload 503 like a call would)."""
        known = self._bases.get(base_id)
        if known is not None:
            return known
        # The model's own head: awake (an adapter head may sleep, and a call would wake it
        # past the memory budget), and its layers are the adapter head's.
        ask = getattr(self.heads.get(base_id), "adapter_base", None)
        shapes = await ask() if ask is not None else None
        if not isinstance(shapes, BaseShapes):
            raise InvalidRequestError(
                f"The model '{base_id}' cannot describe its layers, so adapters cannot be "
                "checked against it.",
                code="adapters_not_supported",
                param="base_model",
            )
        self._bases[base_id] = shapes
        return shapes

    def _put_files(self, record: AdapterRecord, files: dict[str, bytes]) -> None:
        types = {ADAPTER_CONFIG: "application/json", ADAPTER_WEIGHTS: "application/octet-stream"}
        for name in ADAPTER_FILES:
            self.objects.put(f"{record.object_prefix}/{name}", files[name], types[name])

    def _delete_files(self, record: AdapterRecord) -> None:
        for name in ADAPTER_FILES:
            try:
                self.objects.delete(f"{record.object_prefix}/{name}")
            except Exception:  # an orphaned object costs storage, not correctness
                logger.warning("adapter file %s/%s not deleted", record.object_prefix, name)

    async def list_all(self, principal: Principal) -> AdapterList:
        records = await asyncio.to_thread(self.store.list, principal.org_id)
        data = [_object(r) for r in records]
        data.extend(_operator_object(m, self._description(m)) for m in self._operators())
        return AdapterList(data=data)

    async def get(self, name: str, principal: Principal) -> AdapterObject:
        record = await asyncio.to_thread(self.store.get, principal.org_id, name)
        if record is not None:
            return _object(record)
        for model in self._operators():
            if model.id.rpartition(":")[2] == name:
                return _operator_object(model, self._description(model))
        raise adapter_not_found(name)

    async def delete(self, name: str, principal: Principal) -> AdapterDeleted:
        _require_admin(principal)
        record = await asyncio.to_thread(self.store.delete, principal.org_id, name)
        if record is None:
            raise adapter_not_found(name)
        head = self.heads.get(self._adapter_head(record.base_model))
        forget = getattr(head, "forget_adapter", None)
        if forget is not None:
            try:
                await forget(record.id)
            except Exception as err:  # the row is gone: no request can name it any more
                logger.warning("head %s kept deleted adapter %s: %s", record.base_model, name, err)
        await asyncio.to_thread(self._delete_files, record)
        return AdapterDeleted(id=record.id, name=record.name)

    def _adapter_head(self, base_id: str) -> str:
        """The head serving ``base_id``'s adapters: its adapter head where it has one."""
        base = self.catalog.get(base_id)
        return (base.adapter_head_id if base is not None else None) or base_id

    def _operators(self) -> list[AdapterModel]:
        return self.catalog.operator_adapters()

    def _description(self, model: AdapterModel) -> str | None:
        base = self.catalog.get(model.base_id)
        name = model.id.rpartition(":")[2]
        return (
            next((a.description for a in base.adapters if a.name == name), None) if base else None
        )


def _require_admin(principal: Principal) -> None:
    if principal.role != ROLE_ADMIN:
        raise PermissionDeniedError(
            "Uploading and deleting adapters needs the organization role 'admin'.",
            code="admin_required",
        )


def _name_taken(name: str) -> ConflictError:
    return ConflictError(
        f"An adapter named '{name}' exists already; delete it first or choose another name.",
        code="adapter_exists",
        param="name",
    )
