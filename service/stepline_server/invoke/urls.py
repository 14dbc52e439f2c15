"""Signed callback URLs: anyone holding one may complete that one callback, nothing else."""

from __future__ import annotations

from itsdangerous import BadSignature, Signer


class CallbackSigner:
    """Signs callback ids with the server's secrets: the newest signs, all verify."""

    def __init__(self, secrets: list[str]) -> None:
        if not secrets:
            raise ValueError("at least one server secret is needed")
        self._signers = [Signer(s, salt="stepline.callback") for s in secrets]

    def signature(self, callback_id: str) -> str:
        """The signature part of a callback's URL."""
        signed = self._signers[0].sign(callback_id).decode()
        return signed.rsplit(".", 1)[1]

    def url(self, base_url: str, callback_id: str) -> str:
        """The URL that completes ``callback_id`` without an API key."""
        return f"{base_url}/v1/callbacks/{callback_id}/{self.signature(callback_id)}"

    def verify(self, callback_id: str, signature: str) -> bool:
        """True when ``signature`` was made for ``callback_id`` by one of the secrets."""
        value = f"{callback_id}.{signature}".encode()
        for signer in self._signers:
            try:
                signer.unsign(value)
                return True
            except BadSignature:
                continue
        return False
