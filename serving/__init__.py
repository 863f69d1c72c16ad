"""Serving: the stateful BalanceRoute proxy for vLLM / vllm-ascend PD deployments (``serve``),
an emulated PD decode cluster (``emulate``) and a workload replayer (``loadgen``).

The proxy decides nothing itself: it builds the policy's ``ClusterState``/``PoolView`` from its
own bookkeeping each tick and applies the returned ``Assignment`` (see ``docs/serving.md``).
"""
