"""Projects, environments and key roles over real HTTP: 403 for a role, 404 across scopes,
revocation honoured by every orchestrator within a second (failure limits: test_auth_limits.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from stepline_server.api import auth
from stepline_server.store import keys
from tests.support import orchestrator_stack


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def _key(dsn_stack: Any, role: str, environment: str = "production") -> str:
    conn = await dsn_stack.conn()
    try:
        env = await keys.find_environment(conn, keys.DEFAULT_PROJECT, environment)
        assert env is not None
        return await keys.create_key(conn, role, env["id"], role)
    finally:
        await conn.close()


async def test_read_key_is_forbidden_every_write_and_changes_nothing(database_url: str) -> None:
    """A read key reads but gets 403 on writes (nothing made); a write key cannot touch keys."""
    async with orchestrator_stack(database_url) as stack:
        read, write = await _key(stack, "read"), await _key(stack, "write")
        async with httpx.AsyncClient(base_url=stack.url) as http:
            assert (await http.get("/v1/apps", headers=_auth(read))).status_code == 200
            made = await http.post(
                "/v1/apps",
                json={"name": "nope", "url": "http://127.0.0.1:9/"},
                headers=_auth(read),
            )
            assert made.status_code == 403 and made.json()["error"]["code"] == "forbidden"
            apps = (await http.get("/v1/apps", headers=_auth(read))).json()["apps"]
            assert apps == []
            for method, path in [
                ("GET", "/v1/keys"),
                ("POST", "/v1/keys"),
                ("POST", "/v1/environments"),
            ]:
                answer = await http.request(
                    method, path, json={"name": "x", "role": "read"}, headers=_auth(write)
                )
                assert answer.status_code == 403, (method, path, answer.text)
            ok = await http.post(
                "/v1/apps",
                json={"name": "yes", "url": "http://127.0.0.1:9/"},
                headers=_auth(write),
            )
            assert ok.status_code == 201


async def test_environments_and_projects_are_404_to_each_other(database_url: str) -> None:
    """A run of production is 404 to a staging key and to another project's key."""
    async with orchestrator_stack(database_url) as stack:
        staging = await _key(stack, "admin", "staging")
        conn = await stack.conn()
        try:
            other = await keys.create_project(conn, "other")
            assert other is not None
            other_key = await keys.create_key(conn, "o", other["id"])
        finally:
            await conn.close()
        async with httpx.AsyncClient(base_url=stack.url) as http:
            made = await http.post(
                "/v1/apps",
                json={"name": "prod", "url": "http://127.0.0.1:9/"},
                headers=_auth(stack.api_key),
            )
            slug = made.json()["slug"]
            for key in (staging, other_key):
                got = await http.get(f"/v1/apps/{slug}", headers=_auth(key))
                assert got.status_code == 404, got.text
                assert (await http.get("/v1/apps", headers=_auth(key))).json()["apps"] == []
            envs = (await http.get("/v1/environments", headers=_auth(staging))).json()
            assert {e["name"] for e in envs["environments"]} == {
                "production",
                "staging",
                "development",
            }
            projects = (await http.get("/v1/projects", headers=_auth(other_key))).json()
            assert [p["name"] for p in projects["projects"]] == ["other"]
            # A key of another environment cannot be revoked from this one.
            listed = (await http.get("/v1/keys", headers=_auth(staging))).json()["keys"]
            assert [k["environment"] for k in listed] == ["staging"]
            gone = await http.delete(f"/v1/keys/{listed[0]['id']}", headers=_auth(stack.api_key))
            assert gone.status_code == 404


async def test_revoked_key_is_refused_on_every_orchestrator_within_a_second(
    database_url: str,
) -> None:
    """A key revoked through one orchestrator is refused by another that had it cached, < 1 s."""
    async with (
        orchestrator_stack(database_url) as one,
        orchestrator_stack(database_url) as two,
        httpx.AsyncClient() as http,
    ):
        made = await http.post(
            f"{one.url}/v1/keys",
            json={"name": "ci", "role": "write"},
            headers=_auth(one.api_key),
        )
        assert made.status_code == 201, made.text
        created = made.json()
        assert created["role"] == "write" and created["key"].startswith(created["prefix"])
        assert (
            await http.get(f"{two.url}/v1/runs", headers=_auth(created["key"]))
        ).status_code == 200
        listed = (await http.get(f"{one.url}/v1/keys", headers=_auth(one.api_key))).json()
        assert created["id"] in {k["id"] for k in listed["keys"]}
        assert "key" not in listed["keys"][0]
        gone = await http.delete(f"{one.url}/v1/keys/{created['id']}", headers=_auth(one.api_key))
        assert gone.status_code == 204
        revoked_at = time.monotonic()
        assert (
            await http.get(f"{one.url}/v1/runs", headers=_auth(created["key"]))
        ).status_code == 401
        while True:
            answer = await http.get(f"{two.url}/v1/runs", headers=_auth(created["key"]))
            if answer.status_code == 401:
                break
            assert time.monotonic() - revoked_at < 1.0, "still accepted after a second"
            await asyncio.sleep(0.05)


def _cli(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


async def test_cli_projects_and_keys_work_beside_a_running_orchestrator(
    database_url: str, tmp_path: Path
) -> None:
    """`projects create` prints an owner key; `keys create/list/revoke` act on a running server."""
    env = {"DATABASE_URL": database_url, "STEPLINE_LOG_LEVEL": "warning"}
    async with orchestrator_stack(database_url) as stack:
        admin = (await asyncio.to_thread(_cli, "projects", "create", "acme", env=env)).splitlines()[
            -1
        ]
        made = await asyncio.to_thread(
            _cli,
            "keys",
            "create",
            "--project",
            "acme",
            "--environment",
            "staging",
            "--role",
            "read",
            "--name",
            "viewer",
            env=env,
        )
        viewer = made.splitlines()[-1]
        listed = await asyncio.to_thread(_cli, "keys", "list", "--project", "acme", env=env)
        assert "viewer" in listed and "staging" in listed and "owner" in listed
        async with httpx.AsyncClient(base_url=stack.url) as http:
            me = (await http.get("/v1/projects", headers=_auth(admin))).json()["projects"]
            assert [p["name"] for p in me] == ["acme"]
            assert (await http.get("/v1/runs", headers=_auth(viewer))).status_code == 200
            viewer_id = next(line.split()[0] for line in listed.splitlines() if "viewer" in line)
            await asyncio.to_thread(_cli, "keys", "revoke", viewer_id, env=env)
            # Refused within the auth cache's lifetime (each orchestrator looks a key up again
            # at most that often), observed rather than slept for.
            revoked = time.monotonic()
            while (await http.get("/v1/runs", headers=_auth(viewer))).status_code != 401:
                assert time.monotonic() - revoked < 4 * auth._TTL, "the revoked key still works"
                await asyncio.sleep(0.02)
            assert (await http.get("/readyz")).status_code == 200


def test_local_keys_commands_print_what_they_made_and_no_log_lines(tmp_path: Path) -> None:
    """`keys create` on the embedded database of a data folder prints the key and its header
    line, and no log line of its own (the embedded PostgreSQL starting and stopping says
    nothing; only a warning would show, on stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "STEPLINE_LOG_LEVEL")}
    env["STEPLINE_DATA_DIR"] = str(tmp_path / "data")
    env.pop("STEPLINE_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "stepline_server.cli.main", "keys", "create", "--name", "ops"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("API key 'ops' (admin)")
    assert lines[1].startswith("sl_")
    assert '"level": "info"' not in done.stderr, done.stderr
