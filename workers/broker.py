"""kombu's filesystem transport (the embedded broker under ``var/broker``), made safe against
bad message files.

kombu writes a message by creating ``<time>_<uuid>.<queue>.msg`` and then writing into it, while
a consumer may already move and read that file: under load it reads an empty file, and a file
that is not JSON raises out of the consumer and kills the worker. Here a message is written under
a name no consumer picks up (``...msg.part``) and renamed into place once complete, and a message
file that cannot be decoded (empty, truncated, corrupt) is moved to ``<broker>/bad/`` with a log
line naming it, and the next message is read.

``install()`` makes ``filesystem://`` mean this transport in the current process (both the
publishing web process and the worker must use it).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from queue import Empty
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES, _transport_cache, filesystem
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    """Atomic puts; undecodable messages dropped (kept aside) instead of raised."""

    def _put(self, queue, payload, **kwargs):
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            try:
                os.unlink(partial)
            except OSError:
                pass
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):
        """The next message of ``queue``: the oldest file is moved (atomically, so one consumer
        gets it) into the processed folder and read there; one that does not decode is moved to
        ``bad/`` beside it, logged, and the next one is read."""
        wanted = f"{queue}.msg"
        for name in sorted(os.listdir(self.data_folder_in)):
            if name.partition(".")[2] != wanted:
                continue
            taken = os.path.join(self.processed_folder, name)
            try:
                os.replace(os.path.join(self.data_folder_in, name), taken)
            except OSError:
                continue  # another consumer took it
            try:
                with open(taken, "rb") as f:
                    payload = f.read()
            except OSError as exc:
                raise ChannelError(f"Cannot read file {taken!r} from queue.") from exc
            try:
                message = loads(bytes_to_str(payload))
                if not isinstance(message, dict):
                    raise ValueError(f"a JSON {type(message).__name__}, not a message")
            except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
                self._drop_bad(taken, queue, exc)
                continue
            if not self.store_processed:
                os.remove(taken)
            return message
        raise Empty()

    def _drop_bad(self, path: str, queue: str, exc: Exception) -> None:
        bad = os.path.join(os.path.dirname(self.processed_folder.rstrip("/")) or ".", "bad")
        try:
            os.makedirs(bad, exist_ok=True)
            shutil.move(path, os.path.join(bad, os.path.basename(path)))
            kept = f"kept as {os.path.join(bad, os.path.basename(path))}"
        except OSError as move_error:
            kept = f"not kept: {move_error}"
        log.error("broker: dropped an undecodable message file of queue %s (%s: %s); %s",
                  queue, type(exc).__name__, exc, kept)


class Transport(filesystem.Transport):
    """The filesystem transport with :class:`Channel`."""

    Channel = Channel


def install() -> None:
    """Make ``filesystem://`` resolve to this module's Transport in this process."""
    TRANSPORT_ALIASES["filesystem"] = "workers.broker:Transport"
    _transport_cache.pop("filesystem", None)
