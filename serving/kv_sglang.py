"""SGLang's PD dialect: prefill and decode get the same body, tied by a bootstrap room.

What SGLang's router does (``sglang.srt.disaggregation.mini_lb`` and the Rust router): one body,
sent to a prefill server and a decode server at once, carrying ``bootstrap_host`` (the prefill
server's host), ``bootstrap_port`` (its ``--disaggregation-bootstrap-port``) and
``bootstrap_room`` (a random 63-bit integer shared by the two legs); prefill computes the KV and
waits for the decode server of that room to connect and pull it, then answers (its body is not
relayed); decode streams the answer. The decode DP rank is the body field ``routed_dp_rank``
(``data_parallel_rank`` is its deprecated alias).

How the proxy keeps late binding with it: the prefill leg is opened on arrival and held open
while the request waits in the pool; when the tick picks a decode replica, the decode leg goes
out with the same room. So s_i cannot come from prefill's answer (it arrives after decode has
started): it is the proxy's estimate (:func:`~.protocol.approx_prompt_tokens`; exact for token-id
prompts), corrected from decode's first ``usage.prompt_tokens``. The prefill server waits for its
decode peer at most ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`` (300 s by default): that is this
dialect's KV lease (set ``kv_lease_s`` to it; :class:`~balanceroute.core.lease.LeaseRule`).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar
from urllib.parse import urlsplit

__all__ = ["SglangDialect"]

_ROOM_BITS = 63


class SglangDialect:
    """SGLang disaggregation: a bootstrap room per request, prefill held open until decode."""

    name: ClassVar[str] = "sglang"
    has_prefill: ClassVar[bool] = True
    discovers_ranks: ClassVar[bool] = False
    #: the prefill leg is sent on arrival and answered only once decode has pulled the KV
    holds_prefill_open: ClassVar[bool] = True

    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng if rng is not None else random.SystemRandom()

    def bootstrap(self, prefill_url: str, bootstrap_addr: str | None, default_port: int) -> dict[str, Any]:
        """The fields both legs carry: the prefill server's host, its bootstrap port (from
        ``bootstrap_addr`` when configured, else ``default_port``) and a fresh room."""
        host = urlsplit(prefill_url).hostname or "127.0.0.1"
        port = (urlsplit(bootstrap_addr).port if bootstrap_addr else None) or default_port
        return {"bootstrap_host": host, "bootstrap_port": port,
                "bootstrap_room": self.rng.getrandbits(_ROOM_BITS)}

    @staticmethod
    def decode_fields(dp_rank: int | None) -> dict[str, Any]:
        """What decode replica ``dp_rank`` of a DP server needs in the body: ``routed_dp_rank``."""
        return {} if dp_rank is None else {"routed_dp_rank": dp_rank}

    def prefill_params(self, transfer_id: str) -> dict[str, Any]:
        raise RuntimeError("the sglang dialect sends bootstrap fields, not kv_transfer_params")

    def decode_params(self, reply: dict[str, Any], transfer_id: str, bootstrap_addr: str,
                      engine_id: str | None) -> dict[str, Any] | None:
        return None
