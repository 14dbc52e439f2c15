"""The same kind of app with FastAPI: Stepline's handler mounted beside the app's own routes.

Run it with ``STEPLINE_SIGNING_SECRET=whsec_... uvicorn examples.fastapi_app:app --port 8402``,
register ``http://127.0.0.1:8402/stepline/`` (``stepline apps register shop URL``), put the
secret it prints in the app's environment, restart the app, then ``stepline apps sync shop``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

import stepline

sl = stepline.Stepline()  # signing secret from STEPLINE_SIGNING_SECRET


def reserve(order_id: str) -> dict[str, Any]:
    return {"orderId": order_id, "reserved": True}


@sl.workflow("fulfil-order", retries=stepline.Retries(attempts=3), timeout="1d")
async def fulfil(ctx: stepline.Context, input: dict[str, Any]) -> dict[str, Any]:
    stock = await ctx.step("reserve-stock", reserve, input["orderId"])
    await ctx.sleep("settle", input.get("settle", "1s"))
    shipped = await ctx.step("ship", lambda: f"shipped {input['orderId']}")
    return {"stock": stock, "shipped": shipped}


app = FastAPI()
app.mount("/stepline", sl.asgi())


@app.get("/")
async def home() -> dict[str, Any]:
    return {"app": "stepline fastapi example", "workflows": sorted(sl.workflows)}
