"""Errors the engine reports to callers, one class per kind, worded like TGI's router."""

from __future__ import annotations


class TgiError(Exception):
    """Base of every error the engine hands back to a client."""

    #: TGI's `error_type` string (the HTTP front puts it in the JSON body).
    error_type = "generation"


class ValidationError(TgiError):
    """A request broke one of TGI's validation rules; the message names the field and the limit."""

    error_type = "validation"


class OverloadedError(TgiError):
    """More than `max_concurrent_requests` requests are in flight."""

    error_type = "overloaded"

    def __init__(self, message: str = "Model is overloaded") -> None:
        super().__init__(message)


class GenerationError(TgiError):
    """The forward pass or sampling failed for the batch this request was in."""

    error_type = "generation"


class CancelledError(TgiError):
    """The client cancelled the request (or disconnected)."""

    error_type = "cancelled"

    def __init__(self, message: str = "Request was cancelled") -> None:
        super().__init__(message)


class ShutdownError(TgiError):
    """The engine stopped while the request was in flight."""

    error_type = "shutdown"

    def __init__(self, message: str = "The model is shutting down") -> None:
        super().__init__(message)


class ArgumentValidationError(ValueError):
    """A start-up limit combination TGI's launcher rejects (message names both values)."""
