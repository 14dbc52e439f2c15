"""A claim built for the tests that make invoke bodies without a database."""

from __future__ import annotations

import uuid
from typing import Any

from stepline_server.engine.transitions import Claim


def claim(run: dict[str, Any]) -> Claim:
    """The claim of ``run`` (its invocation's fields), as a lease answers it."""
    rest = {
        "project_id": uuid.uuid4(), "app_id": uuid.uuid4(), "status": "running",
        "options": None, "past_deadline": False, "invoke_attempts": 1,
        "undelivered_since": None, "wake_seq": 0, "concurrency_key": None, "generation": None,
        "created_at": None, "pull": False, "priority": 0, "due_in": 0.0, "taken_over": False,
        "app_url": "http://127.0.0.1:9/", "app_secrets": ["s"], "app_protocol": 3,
    }  # fmt: skip
    return Claim.of(rest | run)
