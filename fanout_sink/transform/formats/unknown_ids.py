"""The driver's record of the schema ids the Schema Registry did not know when tasks asked.

Its own module, apart from :mod:`.registry`: the driver keeps it for every sink, and the registry's
libraries take a second or more to import, which a sink reading JSON would pay.
"""

from __future__ import annotations

import time


class UnknownSchemaIds:
    """The driver's record of the schema ids tasks found unknown to the registry, with when each
    was first seen (wall clock, the earliest sighting in any process): handed to every attempt's
    tasks (:meth:`~.registry.RegistryDecoder.seen_since`), so an id's
    ``source.unknown-schema-id-timeout`` runs from its first sighting, not from each new Python
    worker's.

    An id the registry has served since (a task reports it, :meth:`~.registry.RegistryDecoder.served`)
    leaves the record (issue 47 item 3): kept, its first-seen time stayed for ever, and after a new
    executor or Python worker started, the next 404 for it (a lagging follower) counted as long past
    the timeout, so good values were dead-lettered at once instead of the batch being retried. An id
    never served (junk) stays, so a new process dead-letters its values without waiting again.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since: dict[int, float] = {}

    def seen(self, since: dict[int, float]) -> bool:
        """Records ``since`` (ids a task found unknown, with when first seen) and says whether one
        of them is still inside the timeout (the registry may still learn it: retry the batch)."""
        for schema_id, seen in since.items():
            self.since[schema_id] = min(seen, self.since.get(schema_id, seen))
        return any(time.time() - self.since[i] < self.timeout_s for i in since)

    def served(self, schema_ids: list[int]) -> None:
        """Ids a task's registry served: no longer unknown, whatever a follower answers later."""
        for schema_id in schema_ids:
            self.since.pop(schema_id, None)
