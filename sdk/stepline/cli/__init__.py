"""The ``stepline`` command's SDK side: the REST-only commands (runs, apps, workflows, schedules,
events, alerts, bulk actions, tenancy), ``worker`` and ``replay-check``; :mod:`.main` builds the
parser and runs a command. The orchestrator's package adds ``serve``, ``dev`` and ``migrate`` to
the same parser, so both installs answer the same commands."""
