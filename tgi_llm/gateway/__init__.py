"""The gateway: the only listener clients reach on Triton's HTTP, gRPC and metrics ports.

The bundled tritonserver (2.51) has no request-size option and crashes (SIGSEGV) on an HTTP body of
about 4.5 MB or a deeply nested JSON body, on any of its HTTP ports. So tritonserver listens on
127.0.0.1 only, on ports the launcher picks, and this process serves the public ports: it bounds
every request before Triton parses it, closes the admin APIs, forwards the rest unchanged, and turns
Triton's error statuses into the ones clients expect (docs/SECURITY.md).
"""
