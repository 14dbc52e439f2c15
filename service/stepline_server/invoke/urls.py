"""Signed callback URLs (anyone holding one may complete that one callback, nothing else) and
invocation tokens (``<lease>.<signature>``: the progress route knows a token it made, and
refuses anything else with 401 before it reads the body, without a lookup)."""

from __future__ import annotations

import hmac

from itsdangerous import BadSignature, Signer


class CallbackSigner:
    """Signs callback ids with the server's secrets: the newest signs, all verify."""

    def __init__(self, secrets: list[str]) -> None:
        if not secrets:
            raise ValueError("at least one server secret is needed")
        self._signers = [Signer(s, salt="stepline.callback") for s in secrets]
        self._tokens = [Signer(s, salt="stepline.invocation", sep=":") for s in secrets]

    def invocation_token(self, invocation_id: str, lease: str) -> str:
        """The token an invocation sends back on its progress calls: its lease, signed
        together with the invocation's id."""
        signed = self._tokens[0].sign(f"{invocation_id}/{lease}").decode()
        return signed.split("/", 1)[1]

    def lease_of(self, invocation_id: str, token: str) -> str | None:
        """The lease in ``token`` when this orchestrator made it for ``invocation_id``."""
        if not token.isascii() or len(token) > 256:
            return None
        for signer in self._tokens:
            try:
                value = signer.unsign(f"{invocation_id}/{token}").decode()
            except BadSignature:
                continue
            return value.split("/", 1)[1]
        return None

    def signature(self, callback_id: str) -> str:
        """The signature part of a callback's URL."""
        return self._signature(self._signers[0], callback_id)

    def url(self, base_url: str, callback_id: str) -> str:
        """The URL that completes ``callback_id`` without an API key."""
        return f"{base_url}/v1/callbacks/{callback_id}/{self.signature(callback_id)}"

    def verify(self, callback_id: str, signature: str) -> bool:
        """True when ``signature`` is exactly what one of the secrets makes for
        ``callback_id``. The text is compared, not its decoded bytes: base64 has several
        spellings of the same bytes, and only the one this signer writes is accepted."""
        if not signature or not signature.isascii():
            return False  # compare_digest takes ASCII text only
        return any(
            hmac.compare_digest(signature, self._signature(signer, callback_id))
            for signer in self._signers
        )

    @staticmethod
    def _signature(signer: Signer, callback_id: str) -> str:
        return signer.sign(callback_id).decode().rsplit(".", 1)[1]
