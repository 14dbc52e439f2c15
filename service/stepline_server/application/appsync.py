"""An app's sync, as the API and the dashboard both do it: ask the app (or take what a pull
app's worker sent), record what it hosts."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from stepline.protocol import OLDEST_PROTOCOL_VERSION, DescribeResponse
from stepline_server.engine import gathering
from stepline_server.store import apps, deployments
from stepline_server.store.db import Conn, Record

if TYPE_CHECKING:
    from stepline_server.invoke.client import CallResult
    from stepline_server.orchestrator import Orchestrator

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class SyncFailed(Exception):
    """The app could not be asked, or its answer cannot be registered; the message says why."""


class InvalidOptions(SyncFailed):
    """The app described a workflow whose options cannot work (a debounce or a batch out of
    range, say); ``fields`` names each bad one (``workflows.<name>.<option>``)."""

    def __init__(self, message: str, fields: dict[str, str]) -> None:
        super().__init__(message)
        self.fields = fields


@dataclass(frozen=True)
class Synced:
    """The app after its sync, each workflow it hosts with its options, and those it took from
    other apps (each with its ``name`` and the ``app_slug`` it was taken from)."""

    app: Record
    workflows: list[tuple[str, dict[str, Any]]]
    moved: list[Record]


async def sync(o: Orchestrator, row: Record, *, take_over: bool = False) -> Synced:
    """Ask the app at ``row``'s URL (signed) which workflows it hosts and register them
    (taking those other apps registered only with ``take_over``).

    Raises :class:`SyncFailed` when it cannot be reached or describes an invalid workflow,
    :class:`~stepline_server.store.apps.WorkflowsTaken` when another app has one of them, and
    pydantic's ValidationError when a schedule it declares does not parse."""
    result = await o.caller.describe(row["url"], list(row["signing_secrets"]))
    return await register(o, row, _answered(result, row["url"]), take_over=take_over)


async def register(
    o: Orchestrator, row: Record, described: DescribeResponse, *, take_over: bool = False
) -> Synced:
    """Register the workflows ``described`` (a push app's describe answer, or what a pull
    app's worker sent) as ``row``'s; the same errors as :func:`sync`."""
    workflows = workflows_of(described)
    async with o.pool.acquire() as conn, conn.transaction():
        return await _record(o, conn, row, described, workflows, take_over)


async def deploy(
    o: Orchestrator,
    row: Record,
    url: str,
    deployment_id: str | None,
    *,
    take_over: bool = False,
) -> tuple[uuid.UUID, Synced]:
    """Sync push app ``row``'s new deployment at ``url`` (signed with the app's secrets) and,
    in the same transaction, register it as the app's current deployment (going by
    ``deployment_id``, else by the id it answers) with the workflows it hosts: a changed
    definition makes the environment's next definitions version, as any sync does. Runs
    already started stay on their deployments. The same errors as :func:`sync`, and
    :class:`~stepline_server.store.deployments.Taken`; nothing changes on any error."""
    described = _answered(await o.caller.describe(url, list(row["signing_secrets"])), url)
    workflows = workflows_of(described)
    async with o.pool.acquire() as conn, conn.transaction():
        ident = await deployments.create(
            conn,
            row["id"],
            url,
            deployment_id or described.deployment_id,
            given=deployment_id is not None,
        )
        return ident, await _record(o, conn, row, described, workflows, take_over)


def _answered(result: CallResult, url: str) -> DescribeResponse:
    """The app's describe answer; :class:`InvalidOptions` when the SDK answered with a field
    of the wrong type (a pull app's sync refuses the same), :class:`SyncFailed` when there is
    no answer to register."""
    if result.invalid_answer is not None:
        return described_of(result.invalid_answer)
    if not result.ok or not isinstance(result.response, DescribeResponse):
        raise SyncFailed(f"could not sync the app at {url}: {result.reason}")
    return result.response


def described_of(data: Any) -> DescribeResponse:
    """``data`` (a describe answer's JSON, or what a pull app's worker sent) as the app's
    description; :class:`InvalidOptions` naming each wrong field by its workflow's name
    (``workflows.<name>.<field>``) when it is not one."""
    try:
        return DescribeResponse.model_validate(data)
    except ValidationError as exc:
        fields = {_where(data, e["loc"]): e["msg"] for e in exc.errors(include_url=False)}
    field, why = next(iter(fields.items()))
    name, _, option = field.removeprefix("workflows.").partition(".")
    if field.startswith("workflows.") and option and not name.isdigit():  # named, not listed
        message = f"workflow {name!r} declares an invalid {option}: {why}"
    else:
        message = f"the app's description has an invalid {field}: {why}"
    raise InvalidOptions(message, fields)


def _where(data: Any, loc: tuple[int | str, ...]) -> str:
    """A pydantic error's place, dotted, with a workflow's name for its index in the list."""
    parts = [str(p) for p in loc]
    if len(loc) >= 2 and loc[0] == "workflows" and isinstance(loc[1], int):
        listed = data.get("workflows") if isinstance(data, dict) else None
        wf = listed[loc[1]] if isinstance(listed, list) and loc[1] < len(listed) else None
        name = wf.get("name") if isinstance(wf, dict) else None
        if isinstance(name, str) and _NAME.fullmatch(name):
            parts[1] = name
    return ".".join(parts) or "body"


def workflows_of(described: DescribeResponse) -> list[tuple[str, dict[str, Any]]]:
    """The workflows an app described, with their options; :class:`SyncFailed` when one
    cannot be registered."""
    workflows = []
    for wf in described.workflows:
        if not _NAME.fullmatch(wf.name):
            raise SyncFailed(f"the app described a workflow with an invalid name {wf.name[:64]!r}")
        if wf.rate_limit is not None and wf.concurrency is not None:
            raise SyncFailed(
                f"workflow {wf.name!r} declares both a concurrency cap and a rate limit;"
                " a workflow takes one of them"
            )
        options = wf.model_dump(mode="json", by_alias=True, exclude={"name"}, exclude_none=True)
        problems = gathering.option_problems(options)
        if problems:
            field, why = next(iter(problems.items()))
            raise InvalidOptions(
                f"workflow {wf.name!r} declares an invalid {field}: {why}",
                {f"workflows.{wf.name}.{f}": w for f, w in problems.items()},
            )
        workflows.append((wf.name, options))
    return workflows


async def _record(
    o: Orchestrator,
    conn: Conn,
    row: Record,
    described: DescribeResponse,
    workflows: list[tuple[str, dict[str, Any]]],
    take_over: bool,
) -> Synced:
    """Record a sync's workflows in the caller's transaction."""
    recorded = await apps.record_sync(
        conn,
        row,
        workflows,
        described.deployment_id,
        protocol_version=described.protocol_version or OLDEST_PROTOCOL_VERSION,
        sdk_version=described.sdk_version,
        take_over=take_over,
    )
    await o.after_sync(conn, recorded.app, described)
    return Synced(recorded.app, workflows, recorded.moved)
