"""The embedded broker (no server: ``make run`` without REDIS_URL): kombu's filesystem
transport, with each message written whole before any reader can see it.

kombu's own ``_put`` opens the message's file under its final name and only then writes it,
while another process's ``_get`` lists the folder, moves the file away and reads it with no
lock: a worker that polls between the two reads an empty or half-written message, fails on
``JSONDecodeError`` and stops (kombu #1551; issue 49). Here the message is written under a
name no reader takes (``….msg.part``) and renamed into place, which is atomic on one
filesystem. The worker's remote control, whose broadcasts are the busiest writers, is off
on this broker (settings)."""

import os
import uuid

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ALIAS = "tuneplane-filesystem"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(filesystem.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        part = f"{final}.part"  # its suffix is not the queue's: no reader takes it
        try:
            with open(part, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(part, final)
        except OSError as error:
            raise ChannelError(f"Cannot add file {final!r} to directory") from error


class Transport(filesystem.Transport):
    Channel = Channel


TRANSPORT_ALIASES[ALIAS] = f"{__name__}:Transport"
