"""Who a request comes from: the peer's address, unless the peer is a proxy we trust.

``X-Forwarded-For`` is a header any client writes. Only a hop appended by a trusted proxy
(``TUNEPLANE_TRUSTED_PROXIES``: addresses or CIDRs) is believed, read from the right: the
first address that is not a trusted proxy is the client. With no trusted proxies (the
default) the header is never read, so changing it does not make a new client.
"""

import ipaddress

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def parse_trusted_proxies(raw: str) -> tuple:
    """The setting's value: comma-separated addresses or networks."""
    networks = []
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ImproperlyConfigured(
                f"TUNEPLANE_TRUSTED_PROXIES: {item!r} is not an address or a network (CIDR)"
            ) from None
    return tuple(networks)


def _address(text: str):
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address) -> bool:
    return address is not None and any(
        address in network for network in settings.TUNEPLANE_TRUSTED_PROXIES
    )


def client_address(request) -> str:
    peer = request.META.get("REMOTE_ADDR", "")
    client = _address(peer)
    if not _trusted(client):
        return peer
    hops = request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
    for hop in reversed(hops):
        address = _address(hop)
        if address is None:  # a garbled hop: believe nothing left of it
            break
        client = address
        if not _trusted(address):
            break
    return str(client)
