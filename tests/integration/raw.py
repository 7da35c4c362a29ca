"""A hand-driven protocol peer for tests: sends exactly what a test says, frame by frame."""

import asyncio

import msgpack
from websockets.asyncio.client import connect

from rpcbus import protocol as p


class RawPeer:
    opened: "list[RawPeer]" = []   # every peer opened, for the suite to drop after each test

    def __init__(self, ws):
        RawPeer.opened.append(self)
        self.ws = ws
        self.backlog = []
        self.session = None

    @classmethod
    async def open(cls, url, auth=True, name=None, local_addr=None, **creds):
        ws = await connect(url, compression=None, max_size=None, local_addr=local_addr)
        peer = cls(ws)
        if auth:
            await peer.send([p.AUTH, {"protocol": 1, **({"name": name} if name else {}),
                                      **creds}])
            peer.session = (await peer.expect(p.AUTH_OK))[1]["session"]
        return peer

    async def send(self, *msgs):
        await self.ws.send(p.encode(list(msgs)))

    async def send_raw(self, data):
        await self.ws.send(data)

    async def recv(self, timeout=5.0):
        if not self.backlog:
            async with asyncio.timeout(timeout):
                self.backlog.extend(p.decode(await self.ws.recv()))
        return self.backlog.pop(0)

    async def expect(self, kind, timeout=5.0):
        """The next message of this kind; messages of other kinds before it are skipped."""
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.recv(timeout)
                if msg[0] == kind:
                    return msg

    async def provide(self, *names):
        await self.send([p.PROVIDE, 1, list(names)])
        assert (await self.expect(p.OK))[1] == 1

    def abort(self):
        """Drop the TCP connection without a closing handshake, as a crashed process would."""
        self.ws.transport.abort()

    async def close(self):
        await self.ws.close()


def packb(obj):
    return msgpack.packb(obj)
