"""An example app hosting two workflows, mounted the way a user mounts Stepline.

Run it with uvicorn (``uvicorn examples.app:app --port 8401``) and register
``http://127.0.0.1:8401/stepline/`` with the orchestrator; ``stepline dev`` does all of that.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

import stepline

sl = stepline.Stepline()


def create_account(user_id: str) -> dict[str, Any]:
    return {"id": f"acct-{user_id}", "userId": user_id}


async def send_welcome(account: dict[str, Any], token: str) -> str:
    await asyncio.sleep(0.01)  # stands in for an email provider's API
    return f"welcome mail sent to {account['userId']} (token {token[:8]})"


@sl.workflow("onboard-customer", retries=stepline.Retries(attempts=5, max_delay="1m"), timeout="1d")
async def onboard(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
    account = await ctx.step("create-account", create_account, input["userId"])
    ctx.log.info("account created", accountId=account["id"])  # kept once, not on every replay
    started = await ctx.now("started-at")
    await ctx.sleep("cool-off", input.get("coolOff", "2s"))
    ctx.log.info("cool-off over, sending the welcome mail")
    token = await ctx.uuid("token")
    mail = await ctx.step("send-welcome", send_welcome, account, token)
    return {"accountId": account["id"], "mail": mail, "startedAt": started.isoformat()}


@sl.workflow("approve-expense", timeout="7d")
async def approve(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
    approval = await ctx.callback("approval", timeout="3d")
    await ctx.step("ask-approver", lambda: f"please POST a decision to {approval.url}")
    try:
        decision = await approval.wait()
    except stepline.CallbackTimeout:
        return {"approved": False, "reason": "no answer in time"}
    return {"approved": bool(decision.get("approved")), "amount": input.get("amount")}


async def home(request: Any) -> JSONResponse:
    return JSONResponse({"app": "stepline example", "workflows": sorted(sl.workflows)})


app = Starlette(routes=[Route("/", home), Mount("/stepline", app=sl.asgi())])
