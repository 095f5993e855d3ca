"""Placement's writes, one module per concept, each write audited in its own transaction:

- ``submission``: admission, then the workload's record (training and lifecycle jobs,
  deployments, playground sessions, environments); ``storage``: volumes and datasets.
- ``allocator`` (with ``waiting`` and the pure ``placement.decide``): cards for what waits;
  ``starts``: what a start command asks a node to run.
- ``runs`` (jobs and attempts), ``serving`` (deployments, revisions, replicas),
  ``playground`` (playground sessions), ``episodes``: each owner's life, through its table.
- ``members``: a member's moves and its node's commands, for every owner; ``reports``: the
  one path a node's report takes to a member's owner; ``reconcile``: what a node no longer has.
"""
