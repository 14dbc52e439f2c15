"""The child process of ``stepline dev MODULE:ATTR``: the user's Stepline served on loopback.

It imports ``MODULE:ATTR`` afresh (a new process per code change, so no stale module is kept),
gives it the dev signing secret and serves its handler with uvicorn on ``127.0.0.1:PORT`` until
it is told to stop. A module that does not import prints why and exits 3, and the dev loop
waits for the next change.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import uvicorn

from stepline import _replaycheck

SECRET_VARIABLE = "STEPLINE_SIGNING_SECRET"
IMPORT_FAILED = 3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stepline dev (app)")
    p.add_argument("target", metavar="MODULE:ATTR")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    try:
        sl = _replaycheck.load(args.target)
    except _replaycheck.UsageError as exc:
        print(f"stepline dev: {exc}", file=sys.stderr, flush=True)
        return IMPORT_FAILED
    except Exception:  # the user's module raised while importing: show where
        print(f"stepline dev: {args.target} raised while importing:", file=sys.stderr)
        traceback.print_exc()
        sys.stderr.flush()
        return IMPORT_FAILED
    secret = os.environ.get(SECRET_VARIABLE)
    if secret:  # the dev secret wins over one the code passed to Stepline(...)
        sl.signing_secrets = (secret,)
    config = uvicorn.Config(
        sl.asgi(), host="127.0.0.1", port=args.port, log_level="warning", lifespan="on"
    )
    uvicorn.Server(config).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
