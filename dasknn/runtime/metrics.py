"""What crossed between workers, as Dask counted it: the workers' byte counters. (What each message of a run took
to another worker is counted by the exchange itself: :class:`dasknn.runtime.exchange.Endpoint`.)"""

from __future__ import annotations


def bytes_sent(dask_worker) -> int:
    """Bytes this worker has sent to others (run with ``client.run``)."""
    return int(dask_worker.transfer_outgoing_bytes_total)
