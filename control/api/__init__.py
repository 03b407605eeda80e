"""The HTTP control plane (docs/control-plane.md, "The HTTP API"): a FastAPI service in front of ``control.client.ControlPlane``.

Modules: ``app`` (the app and its process-wide parts), ``routes`` (``/v1``), ``auth`` and
``tokens`` (who may call), ``limits`` (request size), ``errors`` (one error shape), ``hub`` and
``sse`` (event streams), ``feed`` (approvals change feed), ``page`` (the approvals page).
"""
