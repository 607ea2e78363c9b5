"""The one transactional producer envelope: begin, produce, send offsets with a deadline, commit or abort.

Workers and the coordinator both write through a Kafka transaction whose failure modes decide
exactly-once: a fenced producer is a zombie and must stop, a stuck call must not block forever, an
abortable error must be aborted before anything else is tried. Keeping that in one class means the
worker and the coordinator cannot drift apart in how they treat those cases.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from fanout_sink.errors import ProducerFencedError, TransactionStuckError
from fanout_sink.kafka.clients import KafkaClientFactory
from fanout_sink.retries import Retry

log = logging.getLogger(__name__)

Header = tuple[str, str | bytes | None]


def is_fenced(error: KafkaError) -> bool:
    """A fenced producer is dead for good: it must be dropped and a new one created.

    librdkafka hands the real fatal error (``_FENCED``, fatal flag set) to the first call that meets
    it only; every later call fails with a plain ``_FATAL`` whose fatal flag is unset.
    """
    return bool(error.fatal()) or error.code() in {
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    }


QUEUE_ROOM_WAIT = Retry(backoff_s=0.05)
"""A message the full producer queue refused is queued again after each 0.05 s of serving delivery
reports (the producer's ``poll``), until the transaction's deadline
(:meth:`TransactionalProducer.produce`)."""

_LIBRDKAFKA_BATCH_SIZE = 1_000_000
"""librdkafka's default ``batch.size``."""


class TransactionalProducer:
    """A producer holding one transactional id; creating it fences every older holder of that id.

    ``fenced_message`` is what a :class:`ProducerFencedError` says when a newer holder took over
    (who this one was and what happens next). After a failure, :attr:`usable` tells the owner
    whether to keep this producer or to create a new one, which fences this one in turn and makes the
    broker abort whatever transaction it left open.
    """

    def __init__(
        self,
        clients: KafkaClientFactory,
        transactional_id: str,
        fenced_message: str,
        batch_bytes: int | None = None,
        initialize: bool = True,
    ) -> None:
        """``batch_bytes``: the most bytes one produce request may batch per partition, when a topic
        it writes accepts less than the producer's default batch (the broker refuses a whole batch
        over the topic's ``max.message.bytes``, however small its messages). ``initialize=False``
        leaves :meth:`initialize` to the owner, which keeps the producer when it times out."""
        self.transactional_id = transactional_id
        self.timeout_s = clients.timeout_s
        self.usable = True
        self._fenced_message = fenced_message
        # Past this the broker aborts the transaction anyway, so waiting longer for anything is futile.
        self._transaction_timeout_s = int(clients.conf.get("transaction.timeout.ms", 60000)) / 1000
        self._deadline = 0.0
        settings = {"transactional.id": transactional_id}
        if batch_bytes is not None:
            configured = int(clients.conf.get("batch.size", _LIBRDKAFKA_BATCH_SIZE))
            settings["batch.size"] = str(min(configured, batch_bytes))
        self._producer = clients.producer(settings, defaults={"transaction.timeout.ms": 60000})
        self.initialized = False
        if initialize:
            self.initialize()

    def initialize(self) -> None:
        """``init_transactions``: fences every older holder of the id. When it times out (the broker
        away), call it again on this producer, not on a new one: the new one's request would race
        the one this producer still has in flight, and whichever the broker serves last fences the
        other, so an owner retrying every second could end up fenced by its own discarded producer."""
        try:
            self._producer.init_transactions(self.timeout_s)
        except KafkaException as exc:
            if is_fenced(exc.args[0]):  # fatal: this producer is done, a new one is needed
                self.usable = False
            raise
        self.initialized = True

    @contextmanager
    def transaction(self) -> Iterator[TransactionalProducer]:
        """Begin, run the body (produce, send offsets), commit; on failure abort or give the producer up.

        - a stuck call (:class:`TransactionStuckError`): the producer is given up;
        - fenced: the producer is given up and :class:`ProducerFencedError` raised;
        - a Kafka error that requires an abort: aborted, the producer stays usable;
        - any other failure (e.g. an exception of the body): aborted, which purges what the body
          queued, and the producer stays usable; if the abort fails, the producer is given up.
        """
        try:
            self.begin()
            yield self
            self.commit()
        except TransactionStuckError:
            self.usable = False
            raise
        except KafkaException as exc:
            error = exc.args[0]
            if is_fenced(error):
                self.usable = False
                raise ProducerFencedError(self._fenced_message) from exc
            if not (error.txn_requires_abort() and self._abort_quietly()):
                self.usable = False
            raise
        except BaseException:
            if not self._abort_quietly():
                self.usable = False
            raise

    def begin(self) -> None:
        self._producer.begin_transaction()
        self._deadline = time.monotonic() + self._transaction_timeout_s

    def commit(self) -> None:
        self._producer.commit_transaction(self.timeout_s)

    def _abort_quietly(self) -> bool:
        try:
            self._producer.abort_transaction(self.timeout_s)
        except KafkaException as exc:
            log.warning("could not abort the transaction of %s: %s", self.transactional_id, exc)
            return False
        return True

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Sequence[Header] | None = None,
    ) -> None:
        """Queue one message inside the open transaction, waiting for room when the queue is full.

        The producer queue holds ``queue.buffering.max.messages`` (100,000 by default) undelivered
        messages; one more makes librdkafka raise ``BufferError``, and a slice with that many dead
        letters would then fail the same way on every retry. Inside a transaction, messages are
        delivered to the broker as they go (invisible until the commit), so serving delivery reports
        frees room. The wait ends at the transaction's deadline (``transaction.timeout.ms``), after
        which the broker aborts the transaction anyway: :class:`TransactionStuckError`.
        """
        tries = QUEUE_ROOM_WAIT.start(self._deadline, sleep=self._producer.poll)
        while True:
            try:
                if headers:
                    self._producer.produce(topic, key=key, value=value, headers=list(headers))
                else:
                    self._producer.produce(topic, key=key, value=value)
                return
            except BufferError:
                if not tries.again():
                    raise TransactionStuckError(
                        f"the producer queue of {self.transactional_id!r} stayed full until the "
                        f"transaction's deadline ({self._transaction_timeout_s:.0f}s): the broker does not "
                        f"take messages for {topic!r}; the producer is replaced and its transaction aborted"
                    ) from None

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: bytes) -> None:
        """``send_offsets_to_transaction`` with a deadline that holds.

        librdkafka can block in it far past its timeout when the group coordinator goes away during
        the call, e.g. across a broker restart (confluentinc/librdkafka#5456 and #5511; seen here with
        confluent-kafka 2.16.1 by the chaos runner: a coordinator stalled for minutes, then was fenced
        by the broker's transaction timeout). The call runs in a helper thread; past the deadline,
        :class:`TransactionStuckError` tells the owner to drop this producer and fence it with a new one.
        """
        done = threading.Event()
        failure: list[BaseException] = []

        def call() -> None:
            try:
                self._producer.send_offsets_to_transaction(offsets, group_metadata, self.timeout_s)
            except BaseException as exc:
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=call, name="send-offsets-to-transaction", daemon=True).start()
        if not done.wait(self.timeout_s + 5.0):
            raise TransactionStuckError(
                f"send_offsets_to_transaction for {[(tp.topic, tp.partition) for tp in offsets]} did not "
                f"return within {self.timeout_s + 5.0:.0f}s (a librdkafka hang after a broker restart); the "
                "producer is replaced and its transaction aborted"
            )
        if failure:
            raise failure[0]

    def flush(self, timeout_s: float | None = None) -> None:
        """Deliver what is queued (outside a transaction: before dropping the producer)."""
        self._producer.flush(self.timeout_s if timeout_s is None else timeout_s)
