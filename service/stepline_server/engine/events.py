"""The types of a run's history events, each named with the transition of its run that appends
it: the SQL enum ``run_event_type`` mirrored (a test checks that the two agree)."""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """A history event's type (``run_events.type``), by the transition that appends it."""

    RUN_STARTED = "run.started"  # start (a run created, a child started); restart (a retry)
    RUN_RETRIED = "run.retried"  # restart: a retry
    RUN_CONTINUED_AS_NEW = "run.continuedAsNew"  # restart: continue_as_new
    RUN_DEBOUNCED = "run.debounced"  # wake: a debounce fired
    RUN_BATCHED = "run.batched"  # wake: a batch fired
    RUN_REPAIRED = "run.repaired"  # wake: a run with no way forward repaired
    RUN_CANCELLING = "run.cancelling"  # cancel request
    RUN_COMPLETED = "run.completed"  # end
    RUN_FAILED = "run.failed"  # end
    RUN_CANCELLED = "run.cancelled"  # end
    RUN_TIMED_OUT = "run.timedOut"  # end
    INVOCATION_STARTED = "invocation.started"  # lease-and-begin
    INVOCATION_ENDED = "invocation.ended"  # progress: the invocation's answer
    STEP_STARTED = "step.started"  # progress
    # progress; lease-and-begin (a timer settled); wake (a callback, an event, a child's end)
    STEP_COMPLETED = "step.completed"
    # progress; lease-and-begin (a callback timed out); wake (a child's end, a child deleted)
    STEP_FAILED = "step.failed"
    STEP_RETRYING = "step.retrying"  # progress
    STEP_SLEEPING = "step.sleeping"  # progress
    STEP_WAITING = "step.waiting"  # progress
    STEP_CANCELLED = "step.cancelled"  # end; cancel request
    CALLBACK_COMPLETED = "callback.completed"  # wake: a callback
    EVENT_RECEIVED = "event.received"  # wake: an event; progress (a wait took an earlier one)
    STATE_SET = "state.set"  # progress
    PATCH_RECORDED = "patch.recorded"  # progress
