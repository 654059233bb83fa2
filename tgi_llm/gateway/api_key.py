"""--api-key on Triton's public ports: the gateway checks `Authorization: Bearer <key>` itself before it
forwards anything but health. tritonserver checks it again on its loopback ports (launcher/security.py),
but its gRPC stream answers a missing header with UNAVAILABLE or, racing, INTERNAL "Internal error
from Core"; checked here, every client gets UNAUTHENTICATED (gRPC) or 401 (HTTP)."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

UNAUTHORIZED = "Unauthorized: send the API key as `Authorization: Bearer <key>` (--api-key)"


@dataclass(frozen=True)
class ApiKey:
    key: str | None

    @classmethod
    def from_env(cls) -> ApiKey:
        """The launcher hands the key over in API_KEY (not argv, where `ps` shows it)."""
        return cls(os.environ.get("API_KEY") or None)

    def allows(self, authorization: str | bytes | None) -> bool:
        if self.key is None:
            return True
        if authorization is None:
            return False
        if isinstance(authorization, bytes):
            authorization = authorization.decode("latin-1")
        scheme, _, token = authorization.strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.key.encode())
