"""--api-key: the one check of `Authorization: Bearer <key>`, for the gateway (Triton's public ports) and the
TGI/OpenAI front. The scheme is case-insensitive (RFC 7235), the key compared exactly in constant time.

The gateway checks it itself before it forwards anything but health. tritonserver checks it again on its
loopback ports (launcher/security.py) by exact comparison with `Bearer <key>`, so the gateway forwards that
canonical header (`upstream`); its gRPC stream also answers a missing header with UNAVAILABLE or, racing,
INTERNAL "Internal error from Core": checked here, every client gets UNAUTHENTICATED (gRPC) or 401 (HTTP)."""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass

#: Triton's restricted-API check on gRPC reads `triton-grpc-protocol-<header>`: the key goes upstream as this.
TRITON_GRPC_AUTHORIZATION = "triton-grpc-protocol-authorization"
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
        if isinstance(authorization, str):  # ASGI and gRPC hand header values over as latin-1 text
            authorization = authorization.encode("latin-1", errors="replace")
        scheme, _, token = authorization.strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key.encode())

    def upstream(self, authorization: str) -> str:
        """The header to forward for an allowed `authorization`: the canonical `Bearer <key>` tritonserver
        compares with, so `bearer <key>` passes there too."""
        return authorization if self.key is None else f"Bearer {self.key}"
