"""Small JSON batches due next parsed in one Arrow call, each handed its share in its turn.

A sink of thousands of one-table partitions decodes a few dozen records per slice, thousands of
times a batch, and a parse's fixed cost dominates there: ``pyarrow.json.read_json`` was ~20 % of a
worker's CPU in a 5,000-table run (py-spy, issue 50), the screening and the newline join around it
more. The slice writer reads a step's small slices ahead (:meth:`SliceProcessor.prepare`) and their
values are screened, joined and parsed together here; each slice's own decode then takes its share.

A share must be exactly what the batch's own parse would have given, so the batches are parsed
together only when that is provable: every value passes the screening (nothing to dead-letter or
parse another way), and the values parse with the decoder's known schema (the schema its earlier
batches had) without a field beyond it, so every column's type is fixed by that schema and each
value is parsed on its own terms, whatever its neighbours hold. A share drops the known columns its
batch leaves entirely null, as :func:`~.json._read_json` does. Anything else (a first batch, a new
field, a type that changed, a bad value, a float that is not finite): nothing is prepared and each
batch is decoded as before.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from fanout_sink.transform.formats.decoded import Decoded
from fanout_sink.transform.formats.json import (
    ONE_BLOCK,
    JsonDecoder,
    NotForArrow,
    arrow_read,
    has_non_finite,
    newline_joined,
    python_loader,
    screen,
)


class ParsedTogether:
    """The shares of batches parsed together, in the order their decodes will ask for them; a decode
    of other values drops them (one per processor, so per decoder)."""

    def __init__(self, decoder: JsonDecoder) -> None:
        self.decoder = decoder
        self._due: deque[tuple[pa.Array, Decoded]] = deque()
        self._lock = threading.Lock()

    def prepare(self, batches: Sequence[pa.Array]) -> None:
        """Parse the non-empty ``batches`` (each the values one decode will get) together, in groups of
        one Arrow block at most (a larger buffer is parsed on Arrow's threads, in chunks)."""
        due: list[tuple[pa.Array, Decoded]] = []
        group: list[pa.Array] = []
        size = 0
        for batch in (b for b in batches if len(b)):
            if group and size + batch.nbytes > ONE_BLOCK:
                due += self._parsed(group)
                group, size = [], 0
            group.append(batch)
            size += batch.nbytes
        if group:
            due += self._parsed(group)
        with self._lock:
            self._due = deque(due)

    def take(self, values: pa.Array) -> Decoded | None:
        """The share prepared for ``values`` if they are the next batch prepared; else ``None`` (and
        nothing prepared is kept: the decodes went another way)."""
        with self._lock:
            if not self._due:
                return None
            batch, decoded = self._due.popleft()
            if batch.equals(values):
                return decoded
            self._due.clear()
            return None

    def _parsed(self, batches: list[pa.Array]) -> list[tuple[pa.Array, Decoded]]:
        """Each batch with its share of one parse of them all; none when that is not provably what
        each batch's own parse would give (see the module's docstring)."""
        known = self.decoder.known_schema()
        if len(batches) < 2 or known is None:
            return []
        values = pa.concat_arrays(batches)
        try:
            _ok, failures = screen(values)
        except NotForArrow:
            return []
        if failures:  # the batches holding a bad value are decoded alone, the others together
            bounds = np.cumsum([len(b) for b in batches])
            bad = set(np.searchsorted(bounds, [index for index, _ in failures], side="right").tolist())
            batches = [batch for n, batch in enumerate(batches) if n not in bad]
            if len(batches) < 2:
                return []
            values = pa.concat_arrays(batches)
        options = pa_json.ParseOptions(explicit_schema=known, unexpected_field_behavior="infer")
        try:
            table = arrow_read(newline_joined(values), options)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return []
        if table.num_rows != len(values) or not table.schema.equals(known) or has_non_finite(table):
            return []
        shares = []
        start = 0
        for batch in batches:
            share = table.slice(start, len(batch))
            start += len(batch)
            empty = [name for name in share.column_names if share.column(name).null_count == share.num_rows]
            share = share.drop_columns(empty) if empty else share
            rows = np.arange(len(batch), dtype=np.int64)
            shares.append((batch, Decoded(share, rows, _python=python_loader(batch))))
        return shares
