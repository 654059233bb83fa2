"""What a client of tritonserver's own (loopback) ports may do: Triton's restricted-API headers.

- The admin APIs (model repository: load, unload, index; shared memory; trace; logging) want a random
  secret made at each start and held only by the launcher and tritonserver's command line. No client
  gets it: the gateway refuses those APIs on the public ports outright, so the secret guards only the
  loopback ports (against other local processes). The model still unloads itself when its engine dies:
  that goes through the Python backend, not through these APIs.
- With --api-key, inference, metadata, config and statistics want `Authorization: Bearer <key>`
  (on gRPC Triton reads it as `triton-grpc-protocol-authorization`; the gateway renames the standard
  `authorization` metadata). Health stays open for load balancers.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

ADMIN_HEADER = "x-tgi-llm-admin"
ADMIN_APIS = ("model-repository", "shared-memory", "trace", "logging")
KEYED_APIS = ("inference", "metadata", "model-config", "statistics")
#: Triton's gRPC restricted-protocol check reads this prefix + the header name.
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True)
class Restrictions:
    admin_secret: str
    api_key: str | None = None

    @classmethod
    def new(cls, api_key: str | None) -> Restrictions:
        return cls(admin_secret=secrets.token_urlsafe(32), api_key=api_key or None)

    def triton_args(self) -> list[str]:
        groups = [(ADMIN_APIS, ADMIN_HEADER, self.admin_secret)]
        if self.api_key:
            groups.append((KEYED_APIS, "authorization", f"Bearer {self.api_key}"))
        args = []
        for apis, header, value in groups:
            spec = f"{','.join(apis)}:{header}={value}"
            args += [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]
        return args

    def grpc_client_metadata(self) -> tuple[tuple[str, str], ...]:
        """What a gRPC client of tritonserver's loopback port (the front) sends to be let in."""
        if not self.api_key:
            return ()
        return ((GRPC_HEADER_PREFIX + "authorization", f"Bearer {self.api_key}"),)
