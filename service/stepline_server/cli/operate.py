"""The operator commands: moved to the SDK (``stepline.cli.operate``) so that an app's install
has them without the server extra; this name stays for the orchestrator's own code."""

from __future__ import annotations

from stepline.cli.operate import ENDED, EXIT, UsageError, add_commands, run

__all__ = ["ENDED", "EXIT", "UsageError", "add_commands", "run"]
