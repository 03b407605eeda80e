"""The control plane's one error type."""


class ControlPlaneError(RuntimeError):
    """Redis unreachable, unknown turn, a request this deployment refuses, or a wait that timed out."""
