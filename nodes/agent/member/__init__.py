"""The agent's members: one process (or container) of a job's attempt, a replica, a session
or an episode on this node, holding the cards it was given (DESIGN §7).

- ``record``: the member as the state dir keeps it; ``store``: that dir, read and written.
- ``policy``: every decision as a pure function of what was observed (refusal, how it
  ended, escalation, restarts, readiness).
- ``launch``: its argv, env and wrapper; ``cgroups``: its confinement as a process.
- ``drivers``: a process, or a container under ``containers``' runtime, behind one interface.
- ``runner``: starts, stops and cleans members, and advances every one on an explicit tick.
- ``probing``: a replica's readiness probe; ``adoption``: members whose state file is lost.
"""
