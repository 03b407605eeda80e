"""Placement of agents' homes on nodes: the records in Redis (``records``), snapshots of homes in
an object store (``snapshots``), a node's side of it (``homes``: materializing a home placed here,
admitting calls) and its housekeeping (``keeper``: heartbeat, snapshots, drain). See
``docs/placement.md``."""
