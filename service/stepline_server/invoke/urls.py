"""Signed callback URLs: anyone holding one may complete that one callback, nothing else."""

from __future__ import annotations

import hmac

from itsdangerous import Signer


class CallbackSigner:
    """Signs callback ids with the server's secrets: the newest signs, all verify."""

    def __init__(self, secrets: list[str]) -> None:
        if not secrets:
            raise ValueError("at least one server secret is needed")
        self._signers = [Signer(s, salt="stepline.callback") for s in secrets]

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
        return any(
            hmac.compare_digest(signature, self._signature(signer, callback_id))
            for signer in self._signers
        )

    @staticmethod
    def _signature(signer: Signer, callback_id: str) -> str:
        return signer.sign(callback_id).decode().rsplit(".", 1)[1]
