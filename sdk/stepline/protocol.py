"""The wire protocol between the orchestrator and an app's SDK handler, defined once.

Three exchanges (see docs/protocol.md):

- ``invoke``: the orchestrator POSTs a signed :class:`InvokeRequest` to the app; the app
  answers with an :class:`InvokeResponse` (``completed``, ``failed``, ``suspended`` or
  ``stale``).
- ``describe``: the orchestrator POSTs a signed :class:`DescribeRequest`; the app answers with
  a :class:`DescribeResponse` listing its workflows (used by app sync).
- ``progress``: while an invocation runs, the SDK POSTs :class:`ProgressRequest` to
  ``{apiUrl}/v1/invocations/{invocationId}/progress`` with ``Authorization: Bearer {token}``;
  the orchestrator commits the updates and answers :class:`ProgressResponse`.
- ``result``: a step result over 256 KiB comes in the invocation as an :class:`OutputRef`;
  the SDK GETs ``{apiUrl}/v1/invocations/{invocationId}/results/{position}?runId={runId}``
  with the same token when the workflow reads it, and the answer is the result's JSON.
- ``steps``: an invocation with ``historyBase`` carries only the steps that changed since that
  invocation's history; an SDK that did not keep it GETs
  ``{apiUrl}/v1/invocations/{invocationId}/steps?runId={runId}`` with the same token, and the
  answer is a :class:`HistoryResponse`.

Log lines (:class:`LogLine`) written since the last call travel with the next progress call or
the invocation's answer, so they are committed with the steps they belong to.

Both sides import these models, so a change here changes both ends at once.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

SIGNATURE_HEADER = "stepline-signature"
"""Header carrying ``t=<unix seconds>,v1=<hex hmac>[,v1=<hex hmac>...]``."""

PROTOCOL_VERSION = 4
"""The newest protocol version both ends speak; an app declares its own in ``describe``
(``protocolVersion``), and in every answer to ``invoke``:

- 1: every invocation carries the run's whole history (an app that declares no version).
- 2: an invocation may carry only what changed since an earlier one (``historyBase``), and the
  ``steps`` exchange fetches the whole history.
- 3: such a delta comes as ``"steps": {"historyBase": ..., "changes": [...]}``, which an SDK of
  an older version refuses (``422``) before running anything, and each answer to ``invoke``
  declares ``protocolVersion``: a delta goes to a run only after an answer of this version.
- 4: published state: a step of kind ``state`` (``ctx.set_state``), and each ``invoke``
  declares the orchestrator's ``protocolVersion``, so an SDK knows whether it may send one.
"""

STATE_PROTOCOL_VERSION = 4
"""The oldest protocol version of an orchestrator that records ``state`` steps: an SDK invoked
by one that declares an older version (or none) refuses ``ctx.set_state`` before sending it."""

DELTAS_PROTOCOL_VERSION = 3
"""The oldest protocol version the orchestrator sends history deltas to (in the form above)."""

OLDEST_PROTOCOL_VERSION = 1
"""The oldest protocol version the orchestrator still speaks."""

PROTOCOL_HEADER = "stepline-protocol"
"""Header on every answer of the SDK's handler (its protocol version): the orchestrator
quotes an answer's error only when it carries this, so a URL pointing at another service
never gets that service's answers reported back."""

MAX_STATE_BYTES = 64 * 1024
"""A published state value's JSON is at most this many bytes (as the workflow gives it)."""
MAX_STATE_STORED_BYTES = 96 * 1024
"""What the orchestrator stores of a state value at most: its JSON, or the envelope of an app
that encrypts or stores its values (base64 makes an encrypted 64 KiB value larger)."""
MAX_STATE_KEYS = 100
"""A run publishes at most this many distinct state keys (setting a key again is free)."""
STATE_KEY_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
"""What a state key looks like: 1 to 128 of ``A-Z a-z 0-9 . _ : -``."""
_STATE_KEY = re.compile(STATE_KEY_PATTERN)


def state_key_problem(key: Any) -> str | None:
    """Why ``key`` is not a state key (None when it is one)."""
    if not isinstance(key, str):
        return f"a state key is a string, not {type(key).__name__}"
    if not _STATE_KEY.fullmatch(key):
        return (
            f"state key {key[:140]!r} is not 1 to 128 characters of letters, digits and "
            "'.', '_', ':', '-'"
        )
    return None


def state_step_name(key: str, n: int) -> str:
    """The name of the step that records the ``n``-th (from 1) ``ctx.set_state`` of ``key`` in
    a run's generation: ``$state:progress``, then ``$state:progress#2``..."""
    return f"$state:{key}" if n <= 1 else f"$state:{key}#{n}"


def state_key_of(step_name: str) -> str:
    """The key a state step's name (:func:`state_step_name`) sets."""
    return step_name.removeprefix("$state:").partition("#")[0]


INLINE_RESULT_BYTES = 256 * 1024
"""Step results whose JSON is larger than this travel in an invocation as an :class:`OutputRef`."""
MAX_RUN_LOG_LINES = 1000
"""A run keeps at most this many log lines; past the cap the newest are dropped (and counted)."""
MAX_RUN_LOG_BYTES = 1024 * 1024
"""A run keeps at most this many bytes of log lines (each line's message and fields as JSON)."""
MAX_LOG_MESSAGE = 16 * 1024
"""A log line's message is at most this many characters (the SDK cuts longer ones)."""


ENVELOPE = "$stepline"
"""The key that marks a value the app encoded (docs/payloads.md): ``{"$stepline": "encrypted",
"key", "data"}`` (AES-256-GCM, by the app's :class:`stepline.Encryption`) or ``{"$stepline":
"ref", "uri", "sha256", "bytes"}`` (stored by the app's :class:`stepline.S3Store`). The
orchestrator stores and shows such a value as it is and never reads inside it."""

SEALED_TEXT_PREFIX = "$stepline:encrypted:"
"""How an encrypted error message or traceback begins: ``$stepline:encrypted:<key>:<data>``."""


def envelope_kind(value: Any) -> str | None:
    """``"encrypted"`` or ``"ref"`` when ``value`` is such an encoded value, else None."""
    if isinstance(value, dict) and isinstance(kind := value.get(ENVELOPE), str):
        if kind == "encrypted" and isinstance(value.get("key"), str):
            return kind
        if kind == "ref" and isinstance(value.get("uri"), str):
            return kind
    return None


def sealed_text_key(text: Any) -> str | None:
    """The key an encrypted error text was sealed with, or None when it is plain text."""
    if isinstance(text, str) and text.startswith(SEALED_TEXT_PREFIX):
        key, sep, _ = text[len(SEALED_TEXT_PREFIX) :].partition(":")
        return key if sep and key else None
    return None


def describe_encoded(value: Any) -> str | None:
    """How a person is shown an encoded value or text (``encrypted (key k2)``, ``stored at
    s3://… (N bytes)``); None when it is a plain one."""
    kind = envelope_kind(value)
    if kind == "encrypted":
        return f"encrypted (key {value['key']})"
    if kind == "ref":
        size = value.get("bytes")
        return f"stored at {value['uri']}" + (f" ({size} bytes)" if isinstance(size, int) else "")
    key = sealed_text_key(value)
    return None if key is None else f"encrypted (key {key})"


class StepKind(StrEnum):
    """What a step is."""

    RUN = "run"  # a user function
    SLEEP = "sleep"  # a timer
    VALUE = "value"  # ctx.now / ctx.uuid
    CALLBACK = "callback"  # a signed URL someone POSTs to
    EVENT = "event"  # waits for POST /v1/events
    INVOKE = "invoke"  # a child workflow run
    STATE = "state"  # ctx.set_state: a value published under a key (protocol 4)


PATCH_STEP_PREFIX = "$patch:"
"""How the name of a patch marker begins (``$patch:fix-tax`` for ``ctx.patched("fix-tax")``): a
``value`` step, so an orchestrator of any version records it; its update carries ``patch``, from
which an orchestrator that knows patches writes ``patch.recorded`` to the run's history. Workflow
code cannot name its own steps so."""

MAX_PATCH_ID = 200
"""A patch id is a string of 1 to this many characters."""


def patch_step_name(patch_id: str) -> str:
    """The name of the step that marks the patch ``patch_id`` in a run's history."""
    return PATCH_STEP_PREFIX + patch_id


def patch_of(record: StepRecord) -> str | None:
    """The patch a recorded step marks, or None when it is not a patch marker."""
    if record.kind is StepKind.VALUE and record.name.startswith(PATCH_STEP_PREFIX):
        return record.name[len(PATCH_STEP_PREFIX) :] or None
    return None


class StepStatus(StrEnum):
    """Where a step stands."""

    RUNNING = "running"  # started, result not yet recorded
    RETRYING = "retrying"  # an attempt failed; the next one is due at wakeAt
    COMPLETED = "completed"  # has its output
    FAILED = "failed"  # attempts spent or terminal error; has its error
    CANCELLED = "cancelled"  # the run was cancelled while the step waited
    SLEEPING = "sleeping"  # a sleep until wakeAt
    WAITING = "waiting"  # a callback, an event or a child run


class Action(StrEnum):
    """What a :class:`StepUpdate` reports."""

    START = "start"  # a run step is about to execute (attempt given)
    COMPLETE = "complete"  # a run or value step's result (output); a state step's value
    FAIL = "fail"  # a run step failed for good (error)
    RETRY = "retry"  # a run step attempt failed; retry after delayMs (error)
    SLEEP = "sleep"  # start a sleep of delayMs
    CALLBACK = "callback"  # create a callback (timeoutMs optional)
    EVENT = "event"  # wait for an event (event, match, timeoutMs)
    INVOKE = "invoke"  # start a child run (workflow, input)


class LogLevel(StrEnum):
    """How much a log line matters (Python's CRITICAL is sent as ``error``)."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ErrorInfo(_Model):
    """An error as recorded: the exception type, a message, an optional stable code and the
    Python traceback as text (at most 16 KiB, its end kept)."""

    type: str = "Error"
    message: str = ""
    code: str | None = None
    traceback: str | None = None


class OutputRef(_Model):
    """A step result too large to carry inline: its size in bytes and the ``md5:`` digest of
    its JSON text, fetched by the step's position when replay reads it."""

    size: int
    digest: str


class StepRecord(_Model):
    """A recorded step, as the orchestrator sends it in an invocation."""

    name: str
    kind: StepKind
    status: StepStatus
    position: int
    attempt: int = 1
    output: Any = None
    error: ErrorInfo | None = None
    wake_at: str | None = Field(default=None, alias="wakeAt")
    callback_id: str | None = Field(default=None, alias="callbackId")
    callback_url: str | None = Field(default=None, alias="callbackUrl")
    child_run_id: str | None = Field(default=None, alias="childRunId")
    timed_out: bool = Field(default=False, alias="timedOut")
    blocked: bool = Field(default=False, alias="blocked")
    """A retrying step whose next attempt is not due yet: its branch waits."""
    output_ref: OutputRef | None = Field(default=None, alias="outputRef")
    """Set instead of ``output`` when the result is large: fetch it by reference."""


class InvokeRequest(_Model):
    """The orchestrator asks the app to run (replay and continue) a workflow run."""

    kind: Literal["invoke"] = "invoke"
    run_id: str = Field(alias="runId")
    workflow: str
    input: Any = None
    invocation_id: str = Field(alias="invocationId")
    token: str
    api_url: str = Field(alias="apiUrl")
    attempt: int = 1
    cancel_requested: bool = Field(default=False, alias="cancelRequested")
    steps: list[StepRecord] = Field(default_factory=list)
    generation: int = 1  # counts from 1; each continue_as_new starts the next, with no steps
    history_base: str | None = Field(default=None, alias="historyBase")
    """Set when ``steps`` holds only what changed since the history invocation ``historyBase``
    brought (the steps written since, the open ones, those just settled): the SDK lays them
    over that history, or fetches the whole one when it did not keep it."""
    protocol_version: int | None = Field(default=None, alias="protocolVersion", ge=1)
    """The orchestrator's protocol version (:data:`PROTOCOL_VERSION`); None: an orchestrator
    from before invocations declared it (it knows no ``state`` steps)."""

    @model_validator(mode="before")
    @classmethod
    def _delta(cls, data: Any) -> Any:
        """A delta on the wire (protocol 3): ``"steps": {"historyBase": ..., "changes": [...]}``
        (an SDK before it refuses a ``steps`` that is not a list, rather than take the changes
        for the whole history); read as ``steps`` and ``history_base``."""
        if isinstance(data, dict) and isinstance(data.get("steps"), dict):
            delta = data["steps"]
            data = {**data, "steps": delta.get("changes"), "historyBase": delta.get("historyBase")}
        return data


class HistoryResponse(_Model):
    """The orchestrator's answer to the SDK's fetch of a run's whole history."""

    steps: list[StepRecord] = Field(default_factory=list)


class DescribeRequest(_Model):
    """The orchestrator asks the app which workflows it hosts."""

    kind: Literal["describe"] = "describe"


class RetryPolicy(_Model):
    """Retry policy of a workflow: ``attempts`` counts every try, the first included."""

    attempts: int = 3
    initial_delay_ms: int = Field(default=1000, alias="initialDelayMs")
    max_delay_ms: int = Field(default=3_600_000, alias="maxDelayMs")
    factor: float = 2.0


class ScheduleSpec(_Model):
    """A schedule declared in code on a workflow."""

    cron: str
    timezone: str = "UTC"
    input: Any = None
    overlap: str = "allow"
    misfire: str = "fire_once"
    # The longest start lag its runs should have (each run shows slaBreached).
    sla_ms: int | None = Field(default=None, alias="slaMs", gt=0, le=366 * 86_400_000)


class RateLimitSpec(_Model):
    """A workflow's rate limit: at most ``limit`` runs start in any window of ``periodMs``
    milliseconds, per value of the input field ``key`` when given."""

    limit: int = Field(ge=1)
    period_ms: int = Field(alias="periodMs", ge=1)
    key: str | None = Field(default=None, min_length=1)


class DebounceSpec(_Model):
    """A workflow's debounce: starts with the same value of the input field ``key`` (all its
    starts, without one) within ``periodMs`` of each other become one run, started with the
    last input ``periodMs`` after the last start, at most ``maxWaitMs`` after the first. The
    orchestrator checks the values at sync (a 422 naming the field)."""

    period_ms: int = Field(alias="periodMs")
    key: str | None = None
    max_wait_ms: int | None = Field(default=None, alias="maxWaitMs")


class BatchSpec(_Model):
    """A workflow's batches: the events that start it are gathered into one run whose input is
    the list of their data, at most ``size`` of them, started when ``size`` are there or
    ``waitMs`` after the first; per value of the event data's field ``key`` when given. The
    orchestrator checks the values at sync (a 422 naming the field)."""

    size: int
    wait_ms: int = Field(alias="waitMs")
    key: str | None = None


class WorkflowInfo(_Model):
    """A workflow as the app describes it."""

    name: str
    retries: RetryPolicy = Field(default_factory=RetryPolicy)
    timeout_ms: int | None = Field(default=None, alias="timeoutMs")
    concurrency: int | None = None
    schedule: ScheduleSpec | None = None
    # How long failed deliveries of its runs are retried (default: the orchestrator's window).
    delivery_window_ms: int | None = Field(default=None, alias="deliveryWindowMs", ge=0)
    # JSON Schemas of a typed workflow's input and output (pydantic models).
    input_schema: dict[str, Any] | None = Field(default=None, alias="inputSchema")
    output_schema: dict[str, Any] | None = Field(default=None, alias="outputSchema")
    # Every event of this name starts a run of the workflow, with the event's data as input.
    on_event: str | None = Field(default=None, alias="onEvent", min_length=1, max_length=256)
    # concurrency counts per value of this input field (without it: for the whole workflow).
    concurrency_key: str | None = Field(default=None, alias="concurrencyKey", min_length=1)
    # While a run with this input field's value has not ended, starting another answers it.
    singleton_key: str | None = Field(default=None, alias="singletonKey", min_length=1)
    # At most so many runs start in any window of the period (per key value).
    rate_limit: RateLimitSpec | None = Field(default=None, alias="rateLimit")
    # Starts close together become one run (an orchestrator that does not know it ignores it).
    debounce: DebounceSpec | None = None
    # The events that start it are gathered into runs of many (likewise ignored where unknown).
    batch: BatchSpec | None = None


class DescribeResponse(_Model):
    """The app's answer to ``describe``."""

    workflows: list[WorkflowInfo]
    deployment_id: str | None = Field(default=None, alias="deploymentId")
    sdk_version: str | None = Field(default=None, alias="sdkVersion")
    protocol: int = 1  # what SDKs before protocol versions sent; read protocol_version
    protocol_version: int | None = Field(default=None, alias="protocolVersion", ge=1)
    """The protocol version the app speaks (:data:`PROTOCOL_VERSION`); None: version 1."""


class StepUpdate(_Model):
    """One change to a run's steps, reported by the SDK in order."""

    name: str = Field(max_length=256, min_length=1)
    kind: StepKind
    action: Action
    attempt: int = 1
    output: Any = None
    error: ErrorInfo | None = None
    delay_ms: int | None = Field(default=None, alias="delayMs")
    timeout_ms: int | None = Field(default=None, alias="timeoutMs")
    # sleep: when the workflow reached it (ms since the epoch, the app's clock); the
    # orchestrator counts the delay from there, within what it knows of the invocation.
    at_ms: int | None = Field(default=None, alias="atMs")
    event: str | None = None
    match: dict[str, Any] | None = None
    workflow: str | None = None
    input: Any = None
    # complete (value): the step marks the patch of this id (ctx.patched); the orchestrator
    # records ``patch.recorded``, one that does not know patches a plain value step.
    patch: str | None = Field(default=None, min_length=1, max_length=MAX_PATCH_ID)
    key: str | None = None  # a state step's key


class LogLine(_Model):
    """A line the workflow logged (``ctx.log``) or a ``logging`` record of a step's execution."""

    at: AwareDatetime
    level: LogLevel
    message: str = Field(max_length=MAX_LOG_MESSAGE)
    fields: dict[str, Any] | None = None
    step_name: str | None = Field(default=None, alias="stepName", min_length=1, max_length=256)
    """The step whose execution wrote it; None for workflow code between steps."""


class ProgressRequest(_Model):
    """Step updates committed during an invocation (one round trip per step)."""

    run_id: str = Field(alias="runId")
    updates: list[StepUpdate]
    seq: int = 0  # 1, 2, 3... within an invocation: a call sent again is not applied twice
    generation: int = 1  # the invocation's: the ids of callbacks and children it makes count it
    # Log lines written since the last call, in order, and how many the SDK dropped (past the
    # cap) before them: they are committed with the updates.
    logs: list[LogLine] = Field(default_factory=list)
    logs_dropped: int = Field(default=0, alias="logsDropped", ge=0, le=2**31 - 1)


class CallbackInfo(_Model):
    """A callback created by a ``callback`` update."""

    id: str
    url: str


class ProgressResponse(_Model):
    """The orchestrator's acknowledgement of a :class:`ProgressRequest`."""

    cancel_requested: bool = Field(default=False, alias="cancelRequested")
    callbacks: dict[str, CallbackInfo] = Field(default_factory=dict)


class InvokeStatus(StrEnum):
    """How an invocation ended."""

    COMPLETED = "completed"  # the workflow returned: output
    FAILED = "failed"  # the workflow raised: error
    SUSPENDED = "suspended"  # every branch is blocked on a sleep, wait, child or retry
    CANCELLED = "cancelled"  # the workflow finished after a cancel request
    STALE = "stale"  # the orchestrator refused a progress call: another invocation owns the run
    CONTINUED = "continued"  # ctx.continue_as_new: start the next generation with input


class InvokeResponse(_Model):
    """The app's answer to ``invoke``: final updates plus how the invocation ended."""

    status: InvokeStatus
    updates: list[StepUpdate] = Field(default_factory=list)
    output: Any = None
    error: ErrorInfo | None = None
    deployment_id: str | None = Field(default=None, alias="deploymentId")
    input: Any = None  # continued: the next generation's input
    logs: list[LogLine] = Field(default_factory=list)
    logs_dropped: int = Field(default=0, alias="logsDropped", ge=0, le=2**31 - 1)
    protocol_version: int | None = Field(default=None, alias="protocolVersion", ge=1)
    """The protocol version of the SDK that answered (:data:`PROTOCOL_VERSION`); None: an SDK
    from before answers declared it (the next invocation carries the whole history)."""


class InvocationAnswer(InvokeResponse):
    """A pull app's worker's answer to an invocation it polled: the run it is for, how long
    the invocation took, and the SDK's answer to ``invoke``."""

    run_id: str = Field(alias="runId")
    duration_ms: int | None = Field(default=None, alias="durationMs", ge=0)


class PollResponse(_Model):
    """Invocations a pull app's worker polled, each leased to it for ``leaseSeconds``: it keeps
    them with heartbeats and answers each with an :class:`InvocationAnswer`."""

    invocations: list[InvokeRequest]
    lease_seconds: float = Field(alias="leaseSeconds")


def dump(model: BaseModel) -> dict[str, Any]:
    """Serialise a protocol model with its wire (camelCase) names."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)
