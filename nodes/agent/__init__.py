"""tuneplane-node: the agent on each machine of a node Fleet. It imports no Django."""

__version__ = "0.1.0"
