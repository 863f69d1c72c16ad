"""The proxy's bookkeeping: state built for the policy, assignments applied, loads conserved."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.core.policies import get_policy
from balanceroute.serving.ledger import Ledger, NoReplica, PoolFull
from tests.factories import ledger_tick


def test_worked_example_imbalance() -> None:
    """DESIGN §1: loads 10, 7, 6, 5 → I = 12."""
    led = Ledger([4, 4, 4, 4], pool_capacity=8)
    led.loads[:] = [10, 7, 6, 5]
    assert led.imbalance() == 12


def test_tick_builds_the_policy_view_and_applies_it() -> None:
    led = Ledger([2, 2], pool_capacity=8)
    tickets = [led.admit(f"r{i}") for i in range(3)]
    for t, s in zip(tickets, (100, 40, 60), strict=True):
        led.enqueue(t, s, now=1.0, lease_s=30)
    state, view = led.build_tick(now=2.0)
    assert state.free_slots.tolist() == [2, 2] and view.prompt_len.tolist() == [100, 40, 60]
    assert view.wait.tolist() == [1.0, 1.0, 1.0]
    placed = ledger_tick(led, get_policy("br0"), now=2.0)
    assert len(placed) == 3 and not led.pool and led.prefilling == 0
    assert led.loads.sum() == 200 and (led.num_active <= 2).all()
    for t in placed:
        assert led.slot_rid[t.replica, t.slot] == t.rid and led.slot_prompt[t.replica, t.slot] == t.prompt_len
    for t in placed:
        led.progress(t, 5)
    assert led.loads.sum() == 200 + 15
    state, _ = led.build_tick(now=3.0) or (None, None)
    assert state is None  # pool empty
    for t in placed:
        assert led.finish(t, "ok") and not led.finish(t, "ok")
    assert not led.loads.any() and led.finished["ok"] == 3 and led.in_flight == 0


def test_tokens_relayed_between_two_reads_are_counted_once_whatever_comes_next() -> None:
    """The relay notes a_i per token; the tick settles it into the loads. A ticket that grows
    and then finishes, is requeued or has its prompt corrected before a settle leaves the loads
    exactly as if every token had been applied at once, and reading them (a view) changes
    nothing (worked example: s = 10, 20, 30 on one replica; a = 4, 6, 9, unsettled)."""
    led = Ledger([3], pool_capacity=3)
    a, b, c = (led.admit(r) for r in "abc")
    for t, s in zip((a, b, c), (10, 20, 30), strict=True):
        led.enqueue(t, s, now=0.0, lease_s=30)
    assert len(ledger_tick(led, get_policy("round_robin"), now=0.0)) == 3
    for t, k in ((a, 2), (a, 4), (b, 6), (c, 9)):
        led.progress(t, k)
    led.finish(a, "ok")  # 10 + 4 leaves with a's unsettled tokens
    led.set_prompt(b, 25)  # 20 -> 25, b's 6 tokens unsettled
    assert led.relayed == 19
    assert led.loads.tolist() == [25 + 6 + 30 + 9]
    assert sorted(led.slot_age[0].tolist()) == [0, 6, 9]
    assert led._loads.tolist() == [25 + 30]  # (the views did not settle anything)
    led.settle()
    assert led._loads.tolist() == [25 + 6 + 30 + 9] and led.loads is led._loads
    led.progress(c, 12)
    led.requeue(c)  # (the ledger does not check "before the first token"; the loads must hold)
    assert led.loads.tolist() == [31] and led.slot_age[0].tolist().count(12) == 0
    led.finish(b, "ok")
    led.finish(c, "ok")
    assert led.loads.tolist() == [0] and not led.slot_age.any()


@pytest.mark.parametrize("streams", [5, 120])  # one by one, and in numpy (more than 32 at once)
def test_a_settle_applies_every_noted_token_once(streams: int) -> None:
    """Tokens noted on many requests of a few replicas between two settles: each replica's load
    grows by exactly its requests' tokens, each slot holds its request's a_i."""
    led = Ledger([32, 32, 32, 32], pool_capacity=128)
    tickets = [led.admit(f"r{i}") for i in range(streams)]
    for i, t in enumerate(tickets):
        led.enqueue(t, 10 + i, now=0.0, lease_s=30)
    assert len(ledger_tick(led, get_policy("round_robin"), now=0.0)) == streams
    before = led.loads.copy()
    for step in range(3):
        for i, t in enumerate(tickets):
            led.progress(t, step + i % 7)
    led.settle()
    expect = before.copy()
    for i, t in enumerate(tickets):
        expect[t.replica] += 2 + i % 7
        assert led.slot_age[t.replica, t.slot] == t.age == 2 + i % 7
    assert led.loads.tolist() == expect.tolist() and led.relayed == sum(2 + i % 7 for i in range(streams))


def test_out_of_service_replica_has_no_free_slots() -> None:
    led = Ledger([2, 2], pool_capacity=8)
    led.set_available(0, False)
    t = led.admit("r")
    led.enqueue(t, 10, now=0.0, lease_s=30)
    state, _ = led.build_tick(now=0.0)
    assert state.free_slots.tolist() == [0, 2]
    assert ledger_tick(led, get_policy("round_robin"), now=0.0)[0].replica == 1
    led.set_available(1, False)
    with pytest.raises(NoReplica):
        led.admit("x")


def test_pool_capacity_counts_prefilling_and_pooled() -> None:
    led = Ledger([1], pool_capacity=2)
    a = led.admit("a")
    led.admit("b")
    with pytest.raises(PoolFull):
        led.admit("c")
    led.enqueue(a, 5, now=0.0, lease_s=30)
    with pytest.raises(PoolFull):
        led.admit("c")


def test_requeue_keeps_place_and_expire_takes_late_tickets_out() -> None:
    led = Ledger([1, 1], pool_capacity=8)
    t0, t1 = led.admit("a"), led.admit("b")
    led.enqueue(t0, 10, now=0.0, lease_s=5)
    ledger_tick(led, get_policy("round_robin"), now=0.0)
    led.enqueue(t1, 20, now=1.0, lease_s=5)
    led.progress(t0, 3)
    led.requeue(t0)
    assert [t.request_id for t in led.pool] == ["a", "b"] and not led.loads.any()
    assert [t.request_id for t in led.expire(now=5.5)] == ["a"]
    assert [t.request_id for t in led.pool] == ["b"]
    assert led.finish(t0, "lease_expired") and led.finish(t1, "client_disconnect")
    assert led.in_flight == 0


def test_set_prompt_corrects_an_estimate() -> None:
    led = Ledger([1], pool_capacity=8)
    t = led.admit("a")
    led.enqueue(t, 10, now=0.0, lease_s=5)
    ledger_tick(led, get_policy("jsq"), now=0.0)
    led.set_prompt(t, 25)
    assert led.loads.tolist() == [25]
    led.finish(t, "ok")
    assert led.loads.tolist() == [0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "enqueue", "tick", "progress", "requeue", "finish",
                                           "expire", "toggle"]),
                          st.integers(0, 1000)), min_size=30, max_size=150),
       st.sampled_from(["br0", "round_robin", "least_load"]))
def test_random_operations_keep_the_accounting(ops, policy_name) -> None:
    """Whatever happens, L_g = Σ (s_i + a_i) over the tickets active on g, n_g ≤ B_g, and once
    every ticket is finished everything is zero and each was counted once. The loads are read
    after some operations only and settled by the ticks (or on their own), so growth not yet
    settled across a finish, a requeue or a corrected prompt is covered, and the unsettled view
    equals the settled state."""
    led = Ledger([3, 2, 4], pool_capacity=6)
    policy = get_policy(policy_name)
    now = 0.0
    for op, x in ops:
        now += 0.1
        alive = list(led.tickets.values())
        pick = alive[x % len(alive)] if alive else None
        if op == "admit":
            try:
                led.admit(f"r{x}")
            except (PoolFull, NoReplica):
                pass
        elif op == "enqueue" and pick is not None and pick.state == "admitted":
            led.enqueue(pick, 1 + x, now=now, lease_s=2.0)
        elif op == "tick":
            ledger_tick(led, policy, now)
        elif op == "progress" and pick is not None:
            led.progress(pick, pick.age + x % 7)
        elif op == "requeue" and pick is not None and pick.state == "active":
            led.requeue(pick)
        elif op == "finish" and pick is not None:
            led.finish(pick, "ok")
        elif op == "expire":
            for t in led.expire(now):
                led.finish(t, "lease_expired")
        elif op == "toggle":
            led.set_available(x % 3, not led.available[x % 3])
        elif op == "set_prompt" and pick is not None:
            led.set_prompt(pick, 1 + x // 3)
        elif op == "settle":  # the view before equals the settled state after
            view, ages = led.loads.tolist(), led.slot_age.tolist()
            led.settle()
            assert led.loads.tolist() == view and led.slot_age.tolist() == ages
        active = [t for t in led.tickets.values() if t.state == "active"]
        if x % 4 == 1:  # (reading the loads applies the progress noted since the last read)
            expect = np.zeros(3, dtype=np.int64)
            for t in active:
                expect[t.replica] += t.prompt_len + t.age
                assert led.slot_age[t.replica, t.slot] == t.age
            assert led.loads.tolist() == expect.tolist()
        assert (led.num_active <= led.capacity).all()
        assert led.num_active.sum() == len(active) == (led.slot_rid >= 0).sum()
        assert led.free_slots().tolist() == np.where(led.available, led.capacity - led.num_active, 0).tolist()
        for g in range(3):  # the free-slot heaps are the slot table's free slots, lowest first
            assert sorted(led._open[g]) == np.flatnonzero(led.slot_rid[g, :led.capacity[g]] < 0).tolist()
            assert not led._open[g] or led._open[g][0] == min(led._open[g])
    for t in list(led.tickets.values()):
        assert led.finish(t, "end")
    assert led.accepted == sum(led.finished.values())
    assert not led.loads.any() and not led.num_active.any() and not led.pool and led.prefilling == 0


def test_the_output_cap_is_the_largest_live_requests_and_unknown_if_one_has_none() -> None:
    """What the tick is told as ``ClusterState.output_cap`` with budgets: the largest output cap
    among the requests not yet ended (admitted, pooled or running); an unknown cap makes it
    unknown; ended requests no longer count."""
    led = Ledger([2, 2], pool_capacity=8)
    a = led.admit("a", output_cap=100)
    b = led.admit("b", output_cap=300)
    c = led.admit("c", output_cap=300)
    assert led.output_cap() == 300
    led.finish(b, "ok")
    assert led.output_cap() == 300  # c still has it
    led.finish(c, "ok")
    assert led.output_cap() == 100
    d = led.admit("d")
    assert led.output_cap() is None
    led.finish(d, "ok")
    led.finish(d, "ok")  # a second end changes nothing
    assert led.output_cap() == 100
    led.finish(a, "ok")
    assert led.output_cap() is None  # nothing live


def test_a_requests_output_cap_follows_the_openai_defaults() -> None:
    from balanceroute.serving.protocol import output_cap

    assert output_cap({"max_tokens": 50, "max_completion_tokens": 20}, chat=True, max_model_len=None) == 20
    assert output_cap({"max_tokens": 50}, chat=True, max_model_len=4096) == 50
    assert output_cap({}, chat=True, max_model_len=4096) == 4096
    assert output_cap({}, chat=True, max_model_len=None) is None
    assert output_cap({"max_tokens": 7}, chat=False, max_model_len=None) == 7
    assert output_cap({}, chat=False, max_model_len=4096) == 16  # the completions API's default
