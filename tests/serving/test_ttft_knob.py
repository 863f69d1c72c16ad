"""The ``ttft_slo_s`` knob in the proxy: it reaches the proxy's policy object through
``policy_params`` and moves that object's decision the expected way — a request that has waited
past the soft first-token deadline is placed before a larger one that fits better; with the knob
off the balance-only choice wins. (A timed emulator run is not a reliable judge here: short
closed-loop runs on a loaded 2-core box show no 30 s starvation tail for the knob to remove; the
simulator's TTFT experiments measure the effect, ``analysis/quality.py``.)"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from balanceroute.core.state import ClusterState, PoolView

from .conftest import mock_proxy, pd_config


def _tick(policy) -> list[int]:
    # replica 1 has one free slot and a 600-token margin; the pool holds a 50-token request that
    # has waited 3 s and a 550-token one that just arrived
    state = ClusterState(loads=np.array([1000, 400]), free_slots=np.array([0, 1]),
                         num_active=np.array([4, 3]))
    pool = PoolView(prompt_len=np.array([50, 550]), wait=np.array([3.0, 0.0]),
                    request_ids=np.array([7, 8]))
    return policy.assign(state, pool).pool_index.tolist()


async def _unused(request: httpx.Request) -> httpx.Response:  # pragma: no cover - no traffic
    return httpx.Response(500)


@pytest.mark.anyio
@pytest.mark.parametrize(("knob", "placed"), [(None, [1]), (10.0, [1]), (1.0, [0])])
async def test_the_knob_reaches_the_proxy_policy_and_moves_its_choice(knob, placed) -> None:
    config = pd_config(policy="br0", policy_params={"ttft_slo_s": knob})
    async with mock_proxy(config, _unused) as (_, proxy):
        assert proxy.policy.ttft_slo_s == knob
        # off, or a deadline far away (u = 550·3/10 = 165 < 550 − 50): balance first, the 550
        # fits. Past the deadline (u = 550·3/1 = 1650): the old request outranks the fit.
        assert _tick(proxy.policy) == placed
