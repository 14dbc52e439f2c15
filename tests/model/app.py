"""The model test's app: workflows whose outputs follow from their inputs and from the bodies
the test sends, and a record of every step execution (run, step, invocation, the run's tag and
generation, whether it raised). Step ``a`` raises on its first ``fails`` executions in each
generation (``POISON``: on every one); the app can be told to answer invocations with an HTTP
error for a while (a delivery failure: the SDK's handler is not reached).

The app is an SDK ``Stepline`` served in the test's process; ``restart`` swaps in a new one
(an app restart: its kept histories and parked executions are gone)."""

from __future__ import annotations

import contextvars
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import stepline

SECRET = "secret-model"
CAP = 1  # the capped workflow's concurrency
EVENT = "model.go"
ATTEMPTS = 3  # every workflow's retries: attempts, the first included
POISON = 99  # a step ``a`` that fails on every execution
LIMIT = "2s"  # the limited workflow's time limit (its runs wait on a callback never sent)
RETRIES = stepline.Retries(attempts=ATTEMPTS, initial_delay="50ms", max_delay="100ms")

_invocation: contextvars.ContextVar[str] = contextvars.ContextVar("model_inv", default="")


def child_output(value: Any) -> dict[str, Any]:
    return {"child-of": value}


def expected_output(input: dict[str, Any], bodies: dict[str, Any]) -> dict[str, Any]:
    """What a run of ``flow`` (or its gated copies) answers for ``input``, given the callback
    body and event data the test sent for it (``bodies``)."""
    out: dict[str, Any] = {"tag": input["tag"], "a": f"a-{input['tag']}"}
    generation = input.get("generations", 1)
    out["generation"] = generation
    if input.get("callback"):
        out["cb"] = bodies.get("cb")
    if input.get("event"):
        out["ev"] = bodies.get("ev")
    if input.get("child"):
        out["child"] = child_output([input["tag"], generation])
    return out


@dataclass(frozen=True)
class Execution:
    """One step execution: its run, step, invocation, the tag and generation it ran for (a
    child's: its parent's), and whether it raised."""

    run: str
    step: str
    invocation: str
    tag: str
    gen: int
    ok: bool


@dataclass
class Executions:
    """Every step execution, and the refusals the app answered instead of invoking."""

    seen: list[Execution] = field(default_factory=list)
    # Invocations running, by workflow: (epoch, invocation id). The epoch moves on when the
    # orchestrator is killed: an invocation it left running in the app is no longer counted
    # against a concurrency cap (its lease lapses and the run is taken over, by design).
    inflight: dict[str, set[tuple[int, str]]] = field(default_factory=dict)
    most: dict[str, int] = field(default_factory=dict)
    epoch: int = 0
    # Each invocation of a run as it reached the app: (run id, the port it came in on, which
    # names the app's deployment).
    invoked: list[tuple[str, int]] = field(default_factory=list)
    refuse_until: float = 0.0
    refuse_status: int = 503

    def step(self, run_id: str, name: str, tag: str, gen: int, ok: bool = True) -> None:
        self.seen.append(Execution(run_id, name, _invocation.get(), tag, gen, ok))

    def tried(self, tag: str, gen: int, name: str) -> int:
        return sum(1 for e in self.seen if (e.tag, e.gen, e.step) == (tag, gen, name))


def build(ex: Executions, secret: str = SECRET, prefix: str = "") -> stepline.Stepline:
    """The model's workflows, each name with ``prefix`` (a pull app's copies have their own)."""
    sl = stepline.Stepline(secret)

    async def body(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        gen = input.get("gen", 1)

        def effect(name: str, value: Any, fails: int = 0) -> Callable[[], Any]:
            def run() -> Any:
                failing = ex.tried(input["tag"], gen, name) < fails
                ex.step(ctx.run_id, name, input["tag"], gen, ok=not failing)
                if failing:
                    raise RuntimeError(f"{name} failed for {input['tag']}")
                return value

            return run

        a = await ctx.step("a", effect("a", f"a-{input['tag']}", input.get("fails", 0)))
        out: dict[str, Any] = {"tag": input["tag"], "a": a}
        if input.get("sleep_ms"):
            await ctx.sleep("nap", f"{input['sleep_ms']}ms")
        if input.get("callback"):
            cb = await ctx.callback("cb", timeout="1h")
            await ctx.step("announce", effect("announce", cb.id))
            if input.get("sleep_ms"):
                await ctx.sleep("nap-2", f"{input['sleep_ms']}ms")
            out["cb"] = await cb.wait()
        if input.get("event"):
            out["ev"] = await ctx.wait_for_event("ev", event=EVENT, match={"tag": input["tag"]})
        if input.get("child"):
            out["child"] = await ctx.invoke("child", prefix + "child", [input["tag"], gen])
        if gen < input.get("generations", 1):
            ctx.continue_as_new({**input, "gen": gen + 1})
        out["generation"] = ctx.generation
        return out

    @sl.workflow(prefix + "flow", retries=RETRIES)
    async def flow(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        return await body(ctx, input)

    @sl.workflow(prefix + "capped", concurrency=stepline.Concurrency(limit=CAP), retries=RETRIES)
    async def capped(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        return await body(ctx, input)

    @sl.workflow(
        prefix + "rated", rate_limit=stepline.RateLimit(limit=5, period="1s"), retries=RETRIES
    )
    async def rated(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        return await body(ctx, input)

    @sl.workflow(prefix + "single", singleton_key="tag", retries=RETRIES)
    async def single(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        return await body(ctx, input)

    @sl.workflow(prefix + "limited", timeout=LIMIT, retries=RETRIES)
    async def limited(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
        return await body(ctx, input)

    @sl.workflow(prefix + "child")
    async def child(ctx: stepline.Context, input: Any) -> Any:
        def run() -> Any:
            ex.step(ctx.run_id, "c", input[0], input[1])
            return child_output(input)

        return await ctx.step("c", run)

    return sl


class App:
    """ASGI: the current Stepline's handler, noting each invocation's id for its steps and how
    many invocations of each workflow run at once."""

    def __init__(self) -> None:
        self.ex = Executions()
        self.secret = SECRET
        self.sl = build(self.ex, self.secret)
        self.built = [self.sl]  # every Stepline made, closed when the test ends
        self.handler = self.sl.asgi()
        self.restarts = 0

    def restart(self, secret: str | None = None) -> None:
        """A new Stepline: nothing kept from before (histories, parked executions)."""
        self.secret = secret or self.secret
        self.sl.parked.clear()
        self.sl = build(self.ex, self.secret)
        self.built.append(self.sl)
        self.handler = self.sl.asgi()
        self.restarts += 1

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.handler(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        data = b"".join(chunks)
        try:
            payload = json.loads(data)
        except ValueError:
            payload = {}
        workflow = payload.get("workflow") if payload.get("kind") == "invoke" else None
        if workflow and time.monotonic() < self.ex.refuse_until:  # a delivery failure
            await send({"type": "http.response.start", "status": self.ex.refuse_status})
            await send({"type": "http.response.body", "body": b"refused"})
            return
        sent = False

        async def again() -> Any:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}

        inv = str(payload.get("invocationId", ""))
        if workflow:
            self.ex.invoked.append((str(payload.get("runId")), int(scope["server"][1])))
        token = _invocation.set(inv)
        entry = (self.ex.epoch, inv)
        if workflow:
            running = self.ex.inflight.setdefault(workflow, set())
            running.add(entry)
            now = sum(1 for e, _ in running if e == self.ex.epoch)
            self.ex.most[workflow] = max(self.ex.most.get(workflow, 0), now)
        try:
            await self.handler(scope, again, send)
        finally:
            _invocation.reset(token)
            if workflow:
                self.ex.inflight[workflow].discard(entry)
