"""No cyclic GC pass in the test process while a test's load runs.

The test process is a provider and a caller at once. A full collection over the heap
the suite has grown (fault ledgers of ~10^6 objects) stalled its loop for 0.3-1.1 s
(measured with gc.callbacks), longer than a provider may take to read a REQUEST (half
the ack timeout): the node then rightly retries, and a test asserting "no ack timeouts"
fails for a fault of the test process, not of the broker.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_gc_pauses() -> Iterator[None]:
    """Collect now, freeze what exists, no automatic passes inside; afterwards the heap is
    unfrozen and collected once more, here, so the pause never lands in a later test."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()
        gc.collect()
