"""The order in which the gate checks passwords under a flood, with the check itself held
by the test (each check waits until the test lets it finish): who goes first, who makes
room in a full queue, and who may use the thread kept for addresses that log in right."""

import asyncio
import os
import sys
import threading

import pytest

from rpcbus.broker import config, gate
from rpcbus.broker.auth import hash_password

from ..timing import wait


class HeldChecks:
    """verify_password stand-in: each check blocks until ``release`` lets one through."""

    def __init__(self):
        self.started = []                 # passwords, in the order checks started
        self.nice = {}                    # password -> its thread's CPU priority (nice)
        self._go = threading.Semaphore(0)

    def __call__(self, stored, password):
        self.nice[password] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        self.started.append(password)
        self._go.acquire()
        return password.startswith("right")   # no two alike: nothing comes from the cache

    def release(self, n=1):
        for _ in range(n):
            self._go.release()


@pytest.fixture
def held(monkeypatch):
    checks = HeldChecks()
    monkeypatch.setattr(gate, "verify_password", checks)
    monkeypatch.setattr(gate, "SCRYPT_THREADS", 1)
    yield checks
    checks.release(1000)


def new_gate():
    cfg = config.load(env={"RPCBUS_AUTH_USERS": '{"u": {"password": "%s", "call": ["*"]}}'
                           % hash_password("right", n=1 << 4)})
    return gate.Gate(cfg)


async def login(g, address, password, answers, user="u"):
    done = asyncio.get_running_loop().create_future()
    g.login({"user": user, "password": password}, lambda user, why: (
        answers.append((address, password, user is not None, why)), done.set_result(why)),
        address)
    return done


async def until(condition):
    async with asyncio.timeout(wait(5)):
        while not condition():
            await asyncio.sleep(0.005)


async def test_a_clean_address_is_checked_before_one_whose_passwords_fail(held):
    g, answers = new_gate(), []
    first = await login(g, "10.0.0.1", "wrong-1", answers)      # running
    for i in range(5):
        await login(g, "10.0.0.1", f"wrong-{i + 2}", answers)    # waiting
    held.release()
    await first                                                  # 10.0.0.1 failed once
    await until(lambda: len(held.started) == 2)
    await login(g, "10.0.0.2", "right", answers)                 # arrives last
    await until(lambda: len(held.started) == 3)                  # starts at once, beside
    assert held.started[2] == "right"                            # the failing address's
    if sys.platform == "linux":      # which yield to everything else; its own does not
        assert held.nice["wrong-2"] == 19 and held.nice["right"] == held.nice["wrong-1"]
    held.release(10)
    await until(lambda: len(answers) == 7)
    g.close()


async def test_a_full_queue_makes_room_for_another_address(held, monkeypatch):
    monkeypatch.setattr(gate, "MAX_QUEUED_LOGINS", 4)
    g, answers = new_gate(), []
    await login(g, "10.0.0.1", "wrong-0", answers)               # running
    for i in range(4):                                           # the queue: full
        await login(g, "10.0.0.1", f"wrong-{i + 1}", answers)
    same = await login(g, "10.0.0.1", "wrong-5", answers)        # its own address: BUSY
    assert await same == gate.BUSY
    other = await login(g, "10.0.0.2", "right", answers)         # another: room made
    await until(lambda: ("10.0.0.1", "wrong-4", False, gate.BUSY) in answers)
    held.release(10)
    assert await other == ""
    assert g.stats["logins_made_room"] == 1
    g.close()


async def test_an_address_that_logged_in_right_does_not_wait_for_a_check_under_way(held):
    g, answers = new_gate(), []
    ok = await login(g, "10.0.0.2", "right-1", answers)
    held.release()
    assert await ok == ""                                        # 10.0.0.2: good now
    await login(g, "10.0.0.1", "wrong-1", answers)               # running, held
    await until(lambda: len(held.started) == 2)
    again = await login(g, "10.0.0.2", "right-2", answers)
    assert g.logins_running == 2                                 # started beside it
    other = await login(g, "10.0.0.3", "right-3", answers)       # not known good: waits
    assert g.logins_running == 2 and g.queued == 1
    held.release(10)
    assert await again == "" and await other == ""
    assert held.started[2:] == ["right-2", "right-3"]
    g.close()


async def test_past_the_budget_a_flood_of_wrong_passwords_is_busy_unchecked(held):
    g, answers = new_gate(), []
    g.budget = gate.CheckBudget(share=0.4, burst=0.2)  # an address: 0.1 s, then 0.2 s a second
    first = await login(g, "10.0.0.1", "wrong-0", answers)
    await asyncio.sleep(0.06)                                    # the check takes 60 ms
    held.release()
    await first                                                  # 10.0.0.1 failed once
    second = await login(g, "10.0.0.1", "wrong-1", answers)      # a typo: checked at once
    assert g.failing_running == 1
    await asyncio.sleep(0.06)
    held.release()
    await second                                                 # 0.12 s spent: over
    flood = [await login(g, "10.0.0.1", f"wrong-{i + 2}", answers) for i in range(5)]
    flood.append(await login(g, "10.0.0.1", "right-x", answers))  # that name's, right or not
    assert [await f for f in flood] == [gate.BUSY] * 6           # answered, never hashed
    assert held.started == ["wrong-0", "wrong-1"] and g.queued == 0
    assert g.hold_for("10.0.0.1") > 0       # each BUSY counts: its next connections wait
    other = await login(g, "10.0.0.1", "wrong-v", answers, user="v")  # another name there:
    assert g.failing_running == 1                                # checked (a budget apart)
    held.release()
    assert await other == "wrong user or password"               # checked, not BUSY
    clean = await login(g, "10.0.0.2", "right-1", answers)       # another address: at once
    assert g.logins_running == 1
    held.release()
    assert await clean == ""
    held.release(10)
    async with asyncio.timeout(wait(5)):                         # never locked out for good:
        while await (await login(g, "10.0.0.1", "right-2", answers)) == gate.BUSY:
            await asyncio.sleep(0.02)                            # BUSY while the debt drains
    assert held.started == ["wrong-0", "wrong-1", "wrong-v", "right-1", "right-2"]
    g.close()


@pytest.fixture
def jwt_gate(tmp_path):
    """A gate holding one Ed25519 token key; a signer for it and one for a stranger."""
    import jwt as pyjwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    ours, stranger = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "k.pub").write_bytes(ours.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    cfg = config.load(env={"RPCBUS_AUTH_TOKEN_KEYS": '{"k": "%s"}' % (tmp_path / "k.pub")})
    g = gate.Gate(cfg)
    checked = []
    verify = g.tokens.verify
    g.tokens.verify = lambda token: (checked.append(token), verify(token))[1]

    def sign(signer, i=0):
        import time
        return pyjwt.encode({"sub": f"app{i}", "iss": "rpcbus", "aud": "rpcbus",
                             "exp": time.time() + 60}, signer, algorithm="EdDSA")
    yield g, checked, lambda i=0: sign(ours, i), lambda i=0: sign(stranger, i)
    g.close()


async def token_login(g, address, token):
    done = asyncio.get_running_loop().create_future()
    g.login({"token": token}, lambda user, why: done.set_result((user, why)), address)
    return await done


async def test_a_jwt_is_verified_off_the_loop_once_for_every_login_presenting_it(jwt_gate):
    g, checked, good, bad = jwt_gate
    threads = []
    verify = g.tokens.verify
    g.tokens.verify = lambda token: (threads.append(threading.current_thread()),
                                     verify(token))[1]
    token = good(1)
    storm = await asyncio.gather(*(token_login(g, f"10.0.0.{i}", token) for i in range(5)))
    assert [user.name for user, _ in storm] == ["app1"] * 5
    assert checked == [token] and threads[0] is not threading.main_thread()
    forged = bad(2)
    refused = await asyncio.gather(*(token_login(g, "10.0.0.9", forged) for _ in range(3)))
    assert all(user is None and "does not verify" in why for user, why in refused)
    assert len(checked) == 2                              # one check for the three


async def test_a_refused_jwt_is_remembered_and_answered_the_later_the_more_it_fails(
        jwt_gate, monkeypatch):
    g, checked, _, bad = jwt_gate
    token = bad()
    loop = asyncio.get_running_loop()
    waited = []
    for _ in range(4):
        t0 = loop.time()
        user, why = await token_login(g, "10.0.0.1", token)
        waited.append(loop.time() - t0)
        assert user is None and "signature does not verify" in why
    assert checked == [token]                            # verified once, then remembered
    assert g.stats["token_refusals_remembered"] == 3
    assert waited[0] < gate.REFUSAL_DELAY <= waited[1] and waited[3] >= 3 * gate.REFUSAL_DELAY
    g.reload(config.load(env={"RPCBUS_AUTH_TOKEN_KEYS": "{}"}))   # a reload forgets them
    assert "takes no JWT tokens" in (await token_login(g, "10.0.0.2", token))[1]


async def test_past_the_budget_a_failing_address_waits_and_others_log_in(jwt_gate,
                                                                         monkeypatch):
    g, checked, good, bad = jwt_gate
    monkeypatch.setattr(gate, "REFUSAL_DELAY", 0.0)
    g.budget = gate.CheckBudget(share=0.001, burst=1e-6)   # spent by the first failure
    assert (await token_login(g, "10.0.0.1", bad(1)))[0] is None
    assert await token_login(g, "10.0.0.1", bad(2)) == (None, gate.BUSY)   # unchecked
    assert await token_login(g, "10.0.0.1", good(3)) == (None, gate.BUSY)  # known or not
    assert len(checked) == 1
    user, _ = await token_login(g, "10.0.0.2", good(4))   # another address: checked
    assert user is not None and user.name == "app4" and user.key == "token:app4"
    assert (await token_login(g, "10.0.0.3", bad(5)))[1] != gate.BUSY   # its first failure
    assert len(checked) == 3
