"""An alert as a person or a client gives it, checked one way for the API and the dashboard.

The fields follow :class:`AlertCreate` and :class:`AlertUpdate`; the destination's URL must have
the form of a URL the orchestrator calls and, after DNS, point where ``STEPLINE_APP_NETWORKS``
allows, as an app's URL must. A refusal is a
:class:`~stepline_server.application.payloads.BadPayload` (``validation_failed``) naming the
field, worded the same for the REST route and the form.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from stepline_server.application import payloads
from stepline_server.application.payloads import AppUrl
from stepline_server.engine.alerts import SUBSCRIBABLE
from stepline_server.store import alerts
from stepline_server.store.db import Record

if TYPE_CHECKING:
    from stepline_server.orchestrator import Orchestrator

_NAME = r"^[^\x00-\x1f\x7f]+$"
_WORKFLOW = r"^[A-Za-z0-9_-]{1,64}$"
URL_FIELD = "destination.url"


def _subscribable(value: str) -> str:
    if value not in SUBSCRIBABLE:
        raise ValueError(f"unknown type {value!r}; one of {', '.join(SUBSCRIBABLE)}")
    return value


AlertType = Annotated[str, AfterValidator(_subscribable)]


class Destination(BaseModel):
    type: Literal["webhook", "slack"]
    url: AppUrl


Types = Annotated[list[AlertType], Field(min_length=1, max_length=16)]


class AlertCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=_NAME)
    on: Types
    workflow: str | None = Field(default=None, pattern=_WORKFLOW)
    destination: Destination


class AlertUpdate(BaseModel):
    name: str | None = Field(default=None, min_length=1, max_length=128, pattern=_NAME)
    on: Types | None = None
    workflow: str | None = Field(default=None, pattern=_WORKFLOW)
    destination: Destination | None = None


def unique(types: list[str]) -> list[str]:
    """``types`` without repeats, in the order given."""
    return list(dict.fromkeys(types))


def parse_create(data: dict[str, Any]) -> AlertCreate:
    """``data`` (a form's fields, shaped as the REST body) as a new alert; BadPayload when a
    field is refused, as the REST route refuses it."""
    try:
        return AlertCreate.model_validate(data)
    except ValidationError as exc:
        raise payloads.invalid_fields(exc) from None


async def check_destination(o: Orchestrator, url: str) -> None:
    """BadPayload naming ``destination.url`` when the egress rules refuse where it points."""
    refusal = await o.alert_sender.resolver.refusal(url)
    if refusal is not None:
        raise payloads.BadPayload(
            "validation_failed", f"invalid fields: {URL_FIELD}", {"fields": {URL_FIELD: refusal}}
        )


async def create(o: Orchestrator, project_id: uuid.UUID, body: AlertCreate) -> Record:
    """Make the alert once its destination passes the egress rules (BadPayload otherwise)."""
    await check_destination(o, body.destination.url)
    async with o.pool.acquire() as conn:
        return await alerts.create(
            conn,
            project_id,
            body.name,
            unique(list(body.on)),
            body.workflow,
            body.destination.type,
            body.destination.url,
        )
