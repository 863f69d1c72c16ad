"""Can this machine move bytes between two processes with NIXL on CPU? Run with the vLLM venv's
Python (``BALANCEROUTE_VLLM_PYTHON``); no vLLM involved.

A target process registers 4 MiB of DRAM holding a known pattern; this process reads it with
NIXL's UCX backend (the transfer vLLM's NixlConnector does with ``kv_buffer_device: cpu``) and
compares. Prints one line, ``ok: ...`` (exit 0) or ``failed: ...`` (exit 1), naming the step that
failed: the real-PD tests read it to tell "this machine cannot do a NIXL transfer at all" from
"vLLM's hand-off went wrong".
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

NBYTES = 4 << 20
TIMEOUT_S = 60.0


def _pattern(torch):  # noqa: ANN001, ANN202 - torch is imported in each process
    return (torch.arange(NBYTES, dtype=torch.int64) * 2654435761 % 251).to(torch.uint8)


def _target(conn) -> None:  # noqa: ANN001
    import torch
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("probe-target", nixl_agent_config(backends=["UCX"]))
    buf = _pattern(torch)
    agent.register_memory(agent.get_reg_descs(buf))
    conn.send((agent.get_agent_metadata(), agent.get_serialized_descs(agent.get_xfer_descs(buf))))
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if any(b"probe-done" in msgs for msgs in agent.get_new_notifs().values()):
            conn.send("notified")
            return
        time.sleep(0.01)
    conn.send("no notification")


def main() -> int:
    step = "import nixl and torch"
    try:
        import torch
        from nixl._api import nixl_agent, nixl_agent_config

        ctx = mp.get_context("spawn")
        here, there = ctx.Pipe()
        child = ctx.Process(target=_target, args=(there,), daemon=True)
        child.start()
        step = "start the target agent"
        deadline = time.monotonic() + TIMEOUT_S
        while not here.poll(0.2):
            if not child.is_alive():
                raise RuntimeError(f"the target process exited with code {child.exitcode} (see its stderr)")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata from the target in {TIMEOUT_S:.0f} s")
        metadata, remote_descs = here.recv()
        step = "create the reading agent"
        agent = nixl_agent("probe-initiator", nixl_agent_config(backends=["UCX"]))
        buf = torch.zeros(NBYTES, dtype=torch.uint8)
        agent.register_memory(agent.get_reg_descs(buf))
        step = "add the target as a remote agent"
        remote = agent.add_remote_agent(metadata)
        step = "start the READ"
        t0 = time.monotonic()
        handle = agent.initialize_xfer("READ", agent.get_xfer_descs(buf), agent.deserialize_descs(remote_descs),
                                       remote, b"probe-done")
        state = agent.transfer(handle)
        step = "complete the READ"
        while state == "PROC" and time.monotonic() - t0 < TIMEOUT_S:
            time.sleep(0.001)
            state = agent.check_xfer_state(handle)
        if state != "DONE":
            raise RuntimeError(f"transfer state {state!r} after {time.monotonic() - t0:.1f} s")
        took = time.monotonic() - t0
        step = "compare the bytes read"
        if not torch.equal(buf, _pattern(torch)):
            raise RuntimeError(f"{int((buf != _pattern(torch)).sum())} of {NBYTES} bytes differ")
        step = "notify the target"
        told = here.recv() if here.poll(TIMEOUT_S) else "no answer"
        if told != "notified":
            raise RuntimeError(f"the target says {told!r}")
        child.join(10)
    except Exception as exc:  # noqa: BLE001 - one line for the tests, whatever went wrong
        print(f"failed: could not {step}: {type(exc).__name__}: {exc}")
        return 1
    print(f"ok: read {NBYTES >> 20} MiB from another process over NIXL/UCX in {took * 1e3:.1f} ms, "
          "bytes equal, notification delivered")
    return 0


if __name__ == "__main__":
    sys.exit(main())
