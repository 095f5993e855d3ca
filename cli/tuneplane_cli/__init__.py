"""tuneplane: the command line of a Tuneplane console (its REST API, over HTTP; no Django)."""

__version__ = "0.1.0"
