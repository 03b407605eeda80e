"""The control plane's error types: one base (``ControlPlaneError``, what the CLI prints) and the
kinds an HTTP front maps to a status code."""

from worker.errors import AgentRuntimeError


class ControlPlaneError(AgentRuntimeError, RuntimeError):
    """Redis unreachable, unknown turn, a request this deployment refuses, or a wait that timed out."""


class ControlPlaneUnavailable(ControlPlaneError):
    """Redis (the turn store and broker) did not answer or failed: retry later, nothing was changed
    by the failed call unless its own docstring says otherwise (HTTP 503)."""


class NotFound(ControlPlaneError):
    """An unknown turn, or a call that is not waiting for approval (HTTP 404)."""


class Refused(ControlPlaneError):
    """A request this deployment refuses as given: unknown toolset, bad turn id, over a size cap,
    invalid edited params (HTTP 400)."""


class Conflict(ControlPlaneError):
    """The target moved on: a call already decided the other way, a turn that no longer waits
    (HTTP 409)."""
