"""What differs between the slurmrestd API versions a ``slurm`` Fleet speaks (DESIGN.md §6).

Slurm 22.05 serves v0.0.38; 23.11 to 24.11 serve v0.0.40 to v0.0.42 (and no longer v0.0.38).
Checked against both, really run (tests/slurm, tests/slurm24), the differences that matter
to the console are few:

- a node's ``state`` is a word with its flags apart (``"mixed"``, ``state_flags: ["DRAIN"]``)
  up to v0.0.38, and one list from v0.0.40 (``["MIXED", "DRAIN"]``, the base state first);
- a job's ``job_state`` is a word, then a list (``["RUNNING"]``);
- a submission carries the script beside the job, then inside it; the environment as a map,
  then as ``NAME=value`` strings; the cards as ``gres``, then as ``tres_per_node``;
- a token slurmrestd cannot verify is a 500 with ``errno -1`` (22.05), then a 511.

Everything else the console reads (``gres``, ``gres_used``, ``reason``, ``partitions``,
``comment``, ``job_id``, the ``errors`` list) is the same in each.
"""

from dataclasses import dataclass

from tuneplane.deployment_settings import SLURM_API_VERSIONS

PATH = "/bin:/usr/bin:/usr/local/bin"


@dataclass(frozen=True)
class Submission:
    """A job for Slurm in the console's terms; each dialect spells it as its version wants."""

    script: str
    name: str
    nodes: int
    workdir: str
    gres: str  # "gpu:h100:2", "gpu:2", or "" for no cards
    comment: str  # the handover key, what Backend.resume finds it by
    partition: str


@dataclass(frozen=True)
class Dialect:
    """One API version's spelling. ``lists``: states are lists (v0.0.40 on)."""

    version: str
    lists: bool

    def node(self, node: dict) -> dict:
        """The node with ``state`` a lower-case word and ``state_flags`` a list, as v0.0.38
        spells it: what scheduling_state_of reads."""
        if not self.lists:
            return node
        words = [str(word) for word in node.get("state") or []]
        return {**node, "state": (words[0] if words else "").lower(), "state_flags": words[1:]}

    def job_state(self, job: dict) -> str:
        """The job's base state (``RUNNING``, ``COMPLETED``, ...)."""
        state = job.get("job_state")
        if self.lists:
            state = (state or [None])[0]
        return str(state or "UNKNOWN")

    def submission(self, job: Submission) -> dict:
        spec = {
            "name": job.name[:200],
            "current_working_directory": job.workdir,
            "standard_output": f"{job.workdir}/tuneplane-%j.out",
        }
        if job.comment:
            spec["comment"] = job.comment
        if job.partition:
            spec["partition"] = job.partition
        if not self.lists:
            spec.update(nodes=job.nodes, environment={"PATH": PATH})
            if job.gres:
                spec["gres"] = job.gres
            return {"script": job.script, "job": spec}
        spec.update(
            script=job.script,
            minimum_nodes=job.nodes,
            maximum_nodes=job.nodes,
            environment=[f"PATH={PATH}"],
        )
        if job.gres:
            spec["tres_per_node"] = f"gres/{job.gres}"
        return {"job": spec}


# v0.0.38 is the one version of these with a state as one word.
DIALECTS = {version: Dialect(version, lists=version != "v0.0.38") for version in SLURM_API_VERSIONS}
