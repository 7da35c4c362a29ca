"""The deterministic simulator (rpcbus.sim) over the real cores: fixed seeds, every check.

Each run is a cluster of 2-4 nodes with providers and callers under load and the
faults its seed draws; ``run_seed`` returns the violations of the promise it found.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

from rpcbus.sim.__main__ import quiet
from rpcbus.sim.run import run_seed
from rpcbus.sim.world import ALL_FAULTS

SEEDS_PER_FAULT = 100


@pytest.fixture(autouse=True, scope="module")
def _quiet() -> None:
    quiet()


def _run(job: tuple[int, str]) -> tuple[int, str, int, list[str]]:
    quiet()
    seed, fault = job
    result = run_seed(seed, (fault,))
    return seed, fault, result.calls, result.violations


def test_a_thousand_seeds_hold_under_each_fault() -> None:
    """100 seeds for each kind of fault (each seed draws it or runs clean): every call
    one outcome, its own, never run twice, every table empty at the end."""
    jobs = [(seed, fault) for fault in ALL_FAULTS for seed in range(1, SEEDS_PER_FAULT + 1)]
    with ProcessPoolExecutor(2) as pool:
        results = list(pool.map(_run, jobs, chunksize=25))
    calls = sum(r[2] for r in results)
    failed = [f"seed {seed} --faults {fault}: {violations[:3]}"
              for seed, fault, _, violations in results if violations]
    assert not failed, "\n".join(failed)
    assert len(results) >= 1000 and calls >= 1_000_000, (len(results), calls)


@pytest.mark.parametrize("seed,fault", [
    (14, "pause"),        # a node declared dead while paused ran an INVOKE moved elsewhere
    (16, "partition"),    # the same, cut off both ways
    (51, "deaf"),         # a deaf origin moved a call its peer had acknowledged
    (55, "duplicate"),    # a replayed INVOKE ran a second time
])
def test_seeds_that_found_bugs_hold(seed: int, fault: str) -> None:
    result = run_seed(seed, (fault,))
    assert result.ok, result.violations[:5]
    assert result.outcomes.get("OK", 0) > 0


def test_the_provider_rules_before_37_are_caught() -> None:
    """With the provider rules from before #37 (handlers start before their ACCEPTs are
    written; staleness by the frame's read time) and handlers that block, seed 3 runs
    calls twice and answers NO_PROVIDER for calls that ran; today's rules hold."""
    before = run_seed(3, ("block",), rules="before-37")
    assert any("ran twice" in v for v in before.violations)
    assert any("NO_PROVIDER but it ran" in v for v in before.violations)
    assert run_seed(3, ("block",)).ok


def test_a_seed_replays_exactly() -> None:
    first, again = run_seed(7, ALL_FAULTS), run_seed(7, ALL_FAULTS)
    assert (first.calls, first.outcomes, first.events) == (again.calls, again.outcomes,
                                                           again.events)
