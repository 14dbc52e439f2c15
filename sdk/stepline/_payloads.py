"""Payloads the orchestrator never reads: :class:`Encryption` (AES-256-GCM) and
:class:`S3Store` (large values kept in an S3-compatible bucket), put together by
:class:`Payloads`, the one place the SDK encodes what it sends and decodes what it reads.

A value is encoded as JSON first, then encrypted (``{"$stepline": "encrypted", "key", "data"}``),
then, when its JSON is still over the store's ``over``, written to the bucket, so only
``{"$stepline": "ref", "uri", "sha256", "bytes"}`` reaches the orchestrator. Reading undoes it
in the other order. Plain values pass through both ways. Error messages and tracebacks are
encrypted as text (``$stepline:encrypted:<key>:<data>``); an error's ``type`` and ``code``
stay plain, so retries and the orchestrator's rules still work (docs/payloads.md).

``cryptography`` (the ``encryption`` extra) and ``botocore`` (the ``s3`` extra, for its
request signing and credential chain; requests go over the SDK's own HTTP client, pooled per
event loop, or httpx for the blocking client) are imported only when used.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import importlib
import os
import re
from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from stepline import _http, _json, protocol
from stepline._errors import StepFailed

__all__ = [
    "PAYLOAD_CORRUPT",
    "PAYLOAD_KEY_UNKNOWN",
    "Codec",
    "Encryption",
    "PayloadError",
    "Payloads",
    "S3Store",
    "parse_size",
]

PAYLOAD_CORRUPT = "payload_corrupt"
"""The code of a step that read a value that cannot be read back as written: a stored object
whose bytes do not match its ``sha256`` (or that is gone), or encrypted data that does not
decrypt with the key it names."""

PAYLOAD_KEY_UNKNOWN = "payload_key_unknown"
"""The code of a step that read a value encrypted with a key the app does not hold."""

KEY_BYTES = 32
NONCE_BYTES = 12
_TRACEBACK_MAX = 16 * 1024  # what a recorded traceback may be (openapi.yaml), sealed too


class PayloadError(Exception):
    """A value that cannot be decoded: ``code`` is :data:`PAYLOAD_CORRUPT` or
    :data:`PAYLOAD_KEY_UNKNOWN`. Never retried: the step that reads it fails with that code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def step_failed(self, step: str) -> StepFailed:
        """The failure of the step ``step`` the value was read in."""
        kind = "PayloadCorrupt" if self.code == PAYLOAD_CORRUPT else "PayloadKeyUnknown"
        return StepFailed(step, kind, str(self), self.code)

    def info(self) -> protocol.ErrorInfo:
        """The error of a run whose input cannot be read."""
        kind = "PayloadCorrupt" if self.code == PAYLOAD_CORRUPT else "PayloadKeyUnknown"
        return protocol.ErrorInfo(type=kind, code=self.code, message=f"the run's input: {self}")


def _extra(module: str, extra: str, what: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"{what} needs the {module.split('.')[0]!r} package: pip install 'stepline[{extra}]'"
        ) from None


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 10**6, "mib": 1024**2, "gb": 10**9, "gib": 1024**3}


def parse_size(value: int | str) -> int:
    """Bytes from an int or a size in words (``"256KiB"``, ``"1MB"``, ``"100"``)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size must not be negative, not {value}")
        return value
    found = _SIZE.match(value) if isinstance(value, str) else None
    if found is None:
        raise ValueError(f"{value!r} is not a size (e.g. 256KiB, 1MiB, 100000)")
    return int(float(found.group(1)) * _UNITS[(found.group(2) or "b").lower()])


class Codec(Protocol):
    """What encrypts values and texts for the orchestrator (:class:`Encryption`)."""

    def seal(self, value: Any, *, deterministic: bool = False) -> dict[str, Any]:
        """``value`` (JSON) as an encrypted envelope."""
        ...

    def open(self, envelope: Mapping[str, Any]) -> Any:
        """The JSON value an envelope holds; :class:`PayloadError` when it cannot be read."""
        ...

    def seal_text(self, text: str) -> str:
        """``text`` encrypted, as text."""
        ...

    def open_text(self, text: str) -> str:
        """The text an encrypted text holds; :class:`PayloadError` when it cannot be read."""
        ...


class Encryption:
    """AES-256-GCM for every value the app sends the orchestrator: ``keys`` maps key ids to
    32-byte keys (``bytes``); the first encrypts, all decrypt (rotation: put the new key
    first, keep the old ones while values encrypted with them may still be read).

    The key id and what the value is (JSON or text) are bound as associated data. Values the
    app sends get a random 96-bit nonce; inputs a client sends (``deterministic``) get one
    derived from the key and the value (HMAC-SHA256), so a start repeated with the same
    ``runKey`` and input, or a callback completed again with the same body, is the same JSON
    to the orchestrator; equal such values are then seen to be equal.
    """

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise ValueError("Encryption needs keys: a dict of key id to a 32-byte key")
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", key_id):
                raise ValueError(
                    f"key id {key_id!r} must be 1 to 64 letters, digits, '.', '_' or '-'"
                )
            if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
                what = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key)
                raise ValueError(
                    f"key {key_id!r} must be {KEY_BYTES} bytes (os.urandom(32)), not {what}"
                )
        aead = _extra(
            "cryptography.hazmat.primitives.ciphers.aead", "encryption", "stepline.Encryption"
        )
        self.key_id: str = next(iter(keys))
        """The key that encrypts."""
        self.key_ids: tuple[str, ...] = tuple(keys)
        self._ciphers = {key_id: aead.AESGCM(bytes(key)) for key_id, key in keys.items()}
        self._nonce_keys = {
            key_id: hmac.new(bytes(key), b"stepline nonce", hashlib.sha256).digest()
            for key_id, key in keys.items()
        }

    def __repr__(self) -> str:
        return f"Encryption(key_ids={list(self.key_ids)!r})"  # never the keys

    def _encrypt(self, plain: bytes, what: bytes, deterministic: bool) -> tuple[str, str]:
        key_id = self.key_id
        aad = b"stepline/" + what + b"/" + key_id.encode()
        if deterministic:
            nonce = hmac.new(self._nonce_keys[key_id], aad + plain, hashlib.sha256).digest()
            nonce = nonce[:NONCE_BYTES]
        else:
            nonce = os.urandom(NONCE_BYTES)
        sealed = nonce + self._ciphers[key_id].encrypt(nonce, plain, aad)
        return key_id, base64.b64encode(sealed).decode("ascii")

    def _decrypt(self, key_id: str, data: Any, what: bytes) -> bytes:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadError(
                PAYLOAD_KEY_UNKNOWN,
                f"the value is encrypted with key {key_id!r}, which is not among this app's "
                f"keys ({', '.join(self.key_ids)})",
            )
        try:
            raw = base64.b64decode(data, validate=True)
            aad = b"stepline/" + what + b"/" + key_id.encode()
            return bytes(cipher.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], aad))
        except Exception:
            raise PayloadError(
                PAYLOAD_CORRUPT, f"the value encrypted with key {key_id!r} does not decrypt"
            ) from None

    def seal(self, value: Any, *, deterministic: bool = False) -> dict[str, Any]:
        key_id, data = self._encrypt(_json.dumps(value), b"json", deterministic)
        return {protocol.ENVELOPE: "encrypted", "key": key_id, "data": data}

    def open(self, envelope: Mapping[str, Any]) -> Any:
        plain = self._decrypt(str(envelope.get("key")), envelope.get("data"), b"json")
        try:
            return _json.loads(plain)
        except ValueError:
            raise PayloadError(PAYLOAD_CORRUPT, "the decrypted value is not JSON") from None

    def seal_text(self, text: str) -> str:
        key_id, data = self._encrypt(text.encode(), b"text", False)
        return f"{protocol.SEALED_TEXT_PREFIX}{key_id}:{data}"

    def open_text(self, text: str) -> str:
        key_id, _, data = text[len(protocol.SEALED_TEXT_PREFIX) :].partition(":")
        return self._decrypt(key_id, data, b"text").decode("utf-8", "replace")


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


class S3Store:
    """Large values kept in an S3-compatible bucket: a value whose JSON is over ``over``
    (default 256 KiB) is written to ``s3://{bucket}/{prefix}{run_id}/{sha256}`` and the
    orchestrator gets only a reference to it.

    ``endpoint_url``: the S3 API's base URL (MinIO, R2, ... or AWS's
    ``https://s3.{region}.amazonaws.com``, the default); requests use path-style URLs.
    Credentials and region come from botocore's usual chain (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``, profiles, instance roles)
    unless given. Needs the ``s3`` extra.
    """

    def __init__(
        self,
        bucket: str,
        *,
        endpoint_url: str | None = None,
        over: int | str = "256KiB",
        prefix: str = "stepline/",
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        timeout: float = 60.0,
    ) -> None:
        if not isinstance(bucket, str) or not re.fullmatch(
            r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket
        ):
            raise ValueError(f"{bucket!r} is not an S3 bucket name")
        self._auth = _extra("botocore.auth", "s3", "stepline.S3Store")
        self._aws = _extra("botocore.awsrequest", "s3", "stepline.S3Store")
        self.bucket = bucket
        self.over = parse_size(over)
        self.prefix = prefix
        self.region = (
            region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        )
        self.endpoint_url = (endpoint_url or f"https://s3.{self.region}.amazonaws.com").rstrip("/")
        self._given = (access_key_id, secret_access_key, session_token)
        self._credentials: Any = None
        self.timeout = timeout
        self._http = _http.HttpClient(timeout=timeout)  # pooled per event loop

    def __repr__(self) -> str:
        return f"S3Store(bucket={self.bucket!r}, endpoint_url={self.endpoint_url!r})"

    def _creds(self) -> Any:
        if self._credentials is None:
            key, secret, token = self._given
            if key and secret:
                credentials = _extra("botocore.credentials", "s3", "stepline.S3Store")
                self._credentials = credentials.Credentials(key, secret, token)
            else:
                session = _extra("botocore.session", "s3", "stepline.S3Store")
                found = session.get_session().get_credentials()
                if found is None:
                    raise RuntimeError(
                        "S3Store found no credentials: set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY, or pass access_key_id and secret_access_key"
                    )
                self._credentials = found
        return self._credentials

    def key_for(self, run_id: str, sha256: str) -> str:
        """The object key of a value of run ``run_id`` with this digest."""
        return f"{self.prefix}{run_id}/{sha256}"

    def _url(self, key: str) -> str:
        return f"{self.endpoint_url}/{self.bucket}/{key}"

    def _signed(self, method: str, key: str, body: bytes) -> tuple[str, dict[str, str]]:
        url = self._url(key)
        headers = {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
        request = self._aws.AWSRequest(method=method, url=url, data=body, headers=headers)
        self._auth.S3SigV4Auth(self._creds().get_frozen_credentials(), "s3", self.region).add_auth(
            request
        )
        return url, dict(request.headers.items())

    def _ref(self, key: str, sha256: str, size: int) -> dict[str, Any]:
        return {
            protocol.ENVELOPE: "ref",
            "uri": f"s3://{self.bucket}/{key}",
            "sha256": sha256,
            "bytes": size,
        }

    def _key_of(self, ref: Mapping[str, Any]) -> str:
        uri = str(ref.get("uri"))
        head = f"s3://{self.bucket}/"
        if not uri.startswith(head):
            raise PayloadError(PAYLOAD_CORRUPT, f"{uri} is not in the bucket {self.bucket!r}")
        return uri[len(head) :]

    @staticmethod
    def _checked(ref: Mapping[str, Any], status: int, body: bytes) -> bytes:
        uri = ref.get("uri")
        if status == 404:
            raise PayloadError(PAYLOAD_CORRUPT, f"the stored value {uri} is gone")
        if status != 200:
            raise OSError(f"reading {uri} answered HTTP {status}: {body[:300]!r}")
        if hashlib.sha256(body).hexdigest() != ref.get("sha256") or len(body) != ref.get("bytes"):
            raise PayloadError(PAYLOAD_CORRUPT, f"the stored value {uri} does not match its sha256")
        return body

    async def put(self, run_id: str, data: bytes) -> dict[str, Any]:
        """Write ``data`` for run ``run_id``; its reference."""
        digest = hashlib.sha256(data).hexdigest()
        key = self.key_for(run_id, digest)
        url, headers = self._signed("PUT", key, data)
        # Named by its digest: writing it again writes the same bytes.
        try:
            answer = await self._http.request("PUT", url, data, headers, idempotent=True)
        except _http.HttpError as exc:
            raise OSError(f"writing {url} failed: {exc}") from None
        if answer.status != 200:
            raise OSError(f"writing {url} answered HTTP {answer.status}: {answer.body[:300]!r}")
        return self._ref(key, digest, len(data))

    async def get(self, ref: Mapping[str, Any]) -> bytes:
        """The bytes a reference names, checked against its ``sha256``."""
        url, headers = self._signed("GET", self._key_of(ref), b"")
        try:
            answer = await self._http.request("GET", url, b"", headers, idempotent=True)
        except _http.HttpError as exc:
            raise OSError(f"reading {url} failed: {exc}") from None
        return self._checked(ref, answer.status, answer.body)

    def get_sync(self, ref: Mapping[str, Any]) -> bytes:
        """:meth:`get`, blocking."""
        url, headers = self._signed("GET", self._key_of(ref), b"")
        answer = httpx.get(url, headers=headers, timeout=self.timeout)
        return self._checked(ref, answer.status_code, answer.content)

    async def aclose(self) -> None:
        """Close the connections it opened."""
        await self._http.aclose()


class Payloads:
    """The codec and the store an app or a client uses, applied where values cross the wire."""

    def __init__(self, codec: Codec | None = None, store: S3Store | None = None) -> None:
        self.codec = codec
        self.store = store

    @property
    def active(self) -> bool:
        return self.codec is not None or self.store is not None

    # -- values --------------------------------------------------------------------------

    def _sealed(self, value: Any, deterministic: bool) -> tuple[Any, bytes]:
        if self.codec is not None:
            value = self.codec.seal(value, deterministic=deterministic)
        return value, _json.dumps(value)

    async def encode(self, value: Any, run_id: str) -> tuple[Any, int]:
        """``value`` (JSON, already checked) as it goes to the orchestrator, and that JSON's
        size; an ``OSError`` when the store cannot be written."""
        value, data = self._sealed(value, False)
        if self.store is not None and len(data) > self.store.over:
            value = await self.store.put(run_id, data)
            data = _json.dumps(value)
        return value, len(data)

    def seal_input(self, value: Any) -> Any:
        """A client's input (a run's, an event's data, a callback's body) encrypted, sealed
        deterministically (the same input is the same JSON); a client never stores one."""
        return value if self.codec is None else self.codec.seal(value, deterministic=True)

    def ready(self, value: Any) -> bool:
        """Whether :meth:`open_now` can decode ``value`` without I/O (it is no reference)."""
        return protocol.envelope_kind(value) != "ref"

    def open_now(self, value: Any) -> Any:
        """``value`` decrypted when it is encrypted, else as it is."""
        if protocol.envelope_kind(value) == "encrypted":
            if self.codec is None:
                raise PayloadError(
                    PAYLOAD_KEY_UNKNOWN,
                    f"the value is encrypted (key {value['key']}) and no codec is configured",
                )
            return self.codec.open(value)
        return value

    def _stored(self, value: Any) -> S3Store:
        if self.store is None:
            raise PayloadError(
                PAYLOAD_CORRUPT, f"the value is stored at {value.get('uri')} and no store is set"
            )
        return self.store

    async def decode(self, value: Any) -> Any:
        """``value`` as the app sent it: fetched when stored, decrypted when encrypted."""
        if protocol.envelope_kind(value) == "ref":
            value = self._loads(await self._stored(value).get(value))
        return self.open_now(value)

    def decode_sync(self, value: Any) -> Any:
        """:meth:`decode`, blocking."""
        if protocol.envelope_kind(value) == "ref":
            value = self._loads(self._stored(value).get_sync(value))
        return self.open_now(value)

    @staticmethod
    def _loads(data: bytes) -> Any:
        try:
            return _json.loads(data)
        except ValueError:
            raise PayloadError(PAYLOAD_CORRUPT, "the stored value is not JSON") from None

    # -- errors --------------------------------------------------------------------------

    def seal_error(self, info: protocol.ErrorInfo | None) -> protocol.ErrorInfo | None:
        """``info`` with its message and traceback encrypted (type and code stay plain)."""
        if info is None or self.codec is None:
            return info
        changes: dict[str, Any] = {}
        if info.message and protocol.sealed_text_key(info.message) is None:
            changes["message"] = self.codec.seal_text(info.message)
        tb = info.traceback
        if tb and protocol.sealed_text_key(tb) is None:
            sealed = self.codec.seal_text(tb)
            if len(sealed) > _TRACEBACK_MAX:  # keep its end (the raise site) within the cap
                keep = (_TRACEBACK_MAX - 200) * 3 // 4
                sealed = self.codec.seal_text(tb.encode()[-keep:].decode("utf-8", "ignore"))
            changes["traceback"] = sealed
        return info.model_copy(update=changes) if changes else info

    def open_error(self, info: protocol.ErrorInfo | None) -> protocol.ErrorInfo | None:
        """``info`` with its message and traceback decrypted (left as they are when they
        cannot be: an error is still an error)."""
        if info is None:
            return None
        changes: dict[str, Any] = {}
        for name in ("message", "traceback"):
            text = getattr(info, name)
            if protocol.sealed_text_key(text) is not None and self.codec is not None:
                with contextlib.suppress(PayloadError):
                    changes[name] = self.codec.open_text(text)
        return info.model_copy(update=changes) if changes else info

    def open_error_json(self, error: Any) -> Any:
        """An error object of the API (a dict) with its texts decrypted."""
        if not isinstance(error, dict) or self.codec is None:
            return error
        opened = dict(error)
        for name in ("message", "traceback"):
            text = opened.get(name)
            if isinstance(text, str) and protocol.sealed_text_key(text) is not None:
                with contextlib.suppress(PayloadError):
                    opened[name] = self.codec.open_text(text)
        return opened

    # -- runs as the API shows them (a client reads them) --------------------------------

    def _run_values(self, run: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
        """Where a run of the API holds values: its input and output, its steps' outputs."""
        places: list[tuple[dict[str, Any], str]] = [(run, "input"), (run, "output")]
        for step in run.get("steps") or []:
            if isinstance(step, dict):
                places.append((step, "output"))
        return places

    def _open_errors(self, run: dict[str, Any]) -> None:
        run["error"] = self.open_error_json(run.get("error"))
        for step in run.get("steps") or []:
            if isinstance(step, dict) and step.get("error") is not None:
                step["error"] = self.open_error_json(step["error"])

    def open_run_sync(self, run: Any) -> Any:
        """A run of the API with its values and errors decoded where they can be (a value
        that cannot be is left as it is)."""
        if not isinstance(run, dict) or not self.active:
            return run
        for holder, name in self._run_values(run):
            if protocol.envelope_kind(holder.get(name)) is not None:
                with contextlib.suppress(PayloadError, OSError):
                    holder[name] = self.decode_sync(holder[name])
        self._open_errors(run)
        return run

    async def open_run(self, run: Any) -> Any:
        """:meth:`open_run_sync`, reading the store without blocking."""
        if not isinstance(run, dict) or not self.active:
            return run
        for holder, name in self._run_values(run):
            if protocol.envelope_kind(holder.get(name)) is not None:
                with contextlib.suppress(PayloadError, OSError):
                    holder[name] = await self.decode(holder[name])
        self._open_errors(run)
        return run

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.aclose()
