"""The ``scenario`` fixture: ``scenario(**options)`` makes a Scenario, closed after the test."""

import pytest

from .harness import Scenario


@pytest.fixture
def scenario(tmp_path, request):
    made = []

    def make(**env):
        sc = Scenario(request.node.name.removeprefix("test_"), str(tmp_path), **env)
        made.append(sc)
        return sc

    yield make
    for sc in made:
        sc.close()
