"""Fixed keys for the payload tests, importable as ``tests.e2e.payload_keys:CODEC`` by the CLI."""

from __future__ import annotations

import stepline

KEY1 = bytes(range(32))
KEY2 = bytes(range(32, 64))

CODEC = stepline.Encryption(keys={"k2": KEY2, "k1": KEY1})
"""The current keys: k2 encrypts, both decrypt."""

OLD_CODEC = stepline.Encryption(keys={"k1": KEY1})
"""Before the rotation: only k1."""
