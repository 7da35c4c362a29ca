"""A provider handler that waits until it is cancelled, for the cancellation tests."""

import asyncio


class Hang:
    """An async handler that runs until cancelled; ``started`` is set as it starts and
    ``cancelled`` as it is cancelled. ``event`` makes them: ``asyncio.Event`` for a test on
    the loop, ``threading.Event`` for one that blocks."""

    def __init__(self, event=asyncio.Event):
        self.started, self.cancelled = event(), event()

    async def __call__(self, data):
        self.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
