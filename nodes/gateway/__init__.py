"""The control gateway: the gRPC NodeControl service and the runtime of one replica (its
streams, database threads and loops), owned by one ``Gateway`` object."""

from .process import Gateway, replica_name
from .service import NodeControlService

__all__ = ["Gateway", "NodeControlService", "replica_name"]
