"""Routes for the caller's project, its environments and its API keys.

An ``admin`` key manages the keys of its own environment (roles up to ``admin``); an ``owner``
key manages every environment of its project: it makes environments and keys of any
environment and role (:mod:`stepline_server.engine.access`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from stepline_server.api import auth
from stepline_server.api.context import orch, path_uuid
from stepline_server.api.errors import Forbidden, InvalidState, NotFound
from stepline_server.api.responses import json_response, read_model, refuse_body
from stepline_server.application import serialize
from stepline_server.engine import access
from stepline_server.store import keys

_ENV_NAME = r"^[a-z0-9][a-z0-9_-]{0,63}$"


class EnvironmentCreate(BaseModel):
    name: str = Field(pattern=_ENV_NAME)


class KeyCreate(BaseModel):
    name: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f]+$")
    role: Literal["owner", "admin", "write", "read"]
    environment: str | None = Field(default=None, pattern=_ENV_NAME)


async def list_projects(request: Request) -> Response:
    """The key's own project (a key sees no other)."""
    ctx = await auth.caller(request)
    async with orch(request).pool.acquire() as conn:
        row = await keys.get_project(conn, ctx.project_id)
    projects = [serialize.project(row)] if row is not None else []
    return json_response({"projects": projects, "nextCursor": None})


async def list_environments(request: Request) -> Response:
    """The environments of the key's project, oldest first."""
    ctx = await auth.caller(request)
    async with orch(request).pool.acquire() as conn:
        rows = await keys.environments(conn, ctx.project_id)
    return json_response(
        {"environments": [serialize.environment(r) for r in rows], "nextCursor": None}
    )


async def create_environment(request: Request) -> Response:
    """A new environment of the project (owner keys only)."""
    ctx = auth.require_role(await auth.caller(request), "owner")
    body = await read_model(request, EnvironmentCreate)
    async with orch(request).pool.acquire() as conn:
        row = await keys.create_environment(conn, ctx.project_id, body.name)
    if row is None:
        raise InvalidState(f"the project already has an environment named {body.name!r}")
    return json_response(serialize.environment(row), 201)


async def list_keys(request: Request) -> Response:
    """The active keys of the caller's environment (of every environment of the project for
    an owner key)."""
    ctx = await auth.require_admin(request)
    async with orch(request).pool.acquire() as conn:
        if access.manages_project(ctx.role):
            rows = await keys.project_keys(conn, ctx.project_id)
        else:
            rows = await keys.environment_keys(conn, ctx.environment_id)
    return json_response(
        {"keys": [serialize.key(r, r["environment"]) for r in rows], "nextCursor": None}
    )


async def create_key(request: Request) -> Response:
    """A key for the caller's environment or (an owner key) another of its project."""
    ctx = await auth.require_admin(request)
    body = await read_model(request, KeyCreate)
    if not access.may_grant(ctx.role, body.role):
        raise Forbidden(
            f"an {ctx.role} key cannot make {body.role} keys; an owner key can",
            {"role": ctx.role, "needed": "owner"},
        )
    other = body.environment is not None and body.environment != ctx.environment
    if other and not access.manages_project(ctx.role):
        raise Forbidden(
            f"an {ctx.role} key makes keys of its own environment ({ctx.environment}) only;"
            " an owner key makes keys of any environment of the project",
            {"role": ctx.role, "needed": "owner"},
        )
    async with orch(request).pool.acquire() as conn:
        env_id, env_name = ctx.environment_id, ctx.environment
        if body.environment is not None and other:
            env = await keys.find_environment(conn, ctx.project_id, body.environment)
            if env is None:
                raise NotFound(f"the project has no environment named {body.environment!r}")
            env_id, env_name = env["id"], env["name"]
        row, secret = await keys.insert_key(conn, body.name, env_id, body.role)
    return json_response({**serialize.key(row, env_name), "key": secret}, 201)


async def revoke_key(request: Request) -> Response:
    """Revoke a key of the caller's environment (of any environment of the project for an
    owner key; an admin key cannot revoke an owner key): refused on every orchestrator within
    1 s, and its dashboard sessions end."""
    ctx = await auth.require_admin(request)
    key_id = path_uuid(request, "keyId", "key")
    await refuse_body(request)
    owner = access.manages_project(ctx.role)
    async with orch(request).pool.acquire() as conn:
        revoked = await keys.revoke_key(
            conn,
            key_id,
            None if owner else ctx.environment_id,
            project_id=ctx.project_id,
            protected=access.protected_from(ctx.role),
        )
    if not revoked:
        raise NotFound(f"no key with id {key_id}")
    request.app.state.keys.forget(key_id)
    return Response(status_code=204)
