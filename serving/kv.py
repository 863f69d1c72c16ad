"""How the KV cache moves from prefill to decode: one small protocol, three dialects.

``nixl``: prefill gets :data:`NIXL_PREFILL_PARAMS` and returns ``kv_transfer_params``, which
decode gets verbatim (vLLM's NixlConnector; vllm-ascend's Mooncake/LLMDataDist connectors).
``mooncake``: vLLM's MooncakeConnector — both sides get the proxy's ``transfer_id``; decode gets
the prefill host's ``remote_bootstrap_addr`` and the ``remote_engine_id`` of the prefill DP rank,
learnt from the bootstrap server's ``/query``. ``sglang``: SGLang's bootstrap room — both legs
get the same body with ``bootstrap_host``/``bootstrap_port``/``bootstrap_room``, the prefill
leg held open until decode is placed (:mod:`.kv_sglang`). ``none``: colocated replicas, no
prefill stage.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import httpx

from .kv_sglang import SglangDialect
from .protocol import NIXL_PREFILL_PARAMS

__all__ = ["KV_DIALECTS", "KvDialect", "MooncakeDialect", "NixlDialect", "NoPrefill", "SglangDialect",
           "get_dialect"]


class KvDialect(Protocol):
    """The KV hand-off of one deployment."""

    name: ClassVar[str]
    #: whether requests go through a prefill stage at all
    has_prefill: ClassVar[bool]
    #: whether prefill targets are DP ranks learnt at run time (:meth:`discover`)
    discovers_ranks: ClassVar[bool]
    #: whether the prefill leg is sent on arrival and held open until decode is placed (SGLang)
    holds_prefill_open: ClassVar[bool]

    def prefill_params(self, transfer_id: str) -> dict[str, Any]:
        """``kv_transfer_params`` of the prefill request."""
        ...

    def decode_params(self, reply: dict[str, Any], transfer_id: str, bootstrap_addr: str,
                      engine_id: str | None) -> dict[str, Any] | None:
        """``kv_transfer_params`` of the decode request, from prefill's ``reply``; ``None`` when
        prefill gave nothing usable (decode then recomputes the prompt)."""
        ...


class NixlDialect:
    """vLLM NIXL: decode gets what prefill returned."""

    name: ClassVar[str] = "nixl"
    has_prefill: ClassVar[bool] = True
    discovers_ranks: ClassVar[bool] = False
    holds_prefill_open: ClassVar[bool] = False

    def prefill_params(self, transfer_id: str) -> dict[str, Any]:
        return dict(NIXL_PREFILL_PARAMS)

    def decode_params(self, reply: dict[str, Any], transfer_id: str, bootstrap_addr: str,
                      engine_id: str | None) -> dict[str, Any] | None:
        kv = reply.get("kv_transfer_params")
        return kv if isinstance(kv, dict) else None


class MooncakeDialect:
    """vLLM MooncakeConnector: a shared ``transfer_id`` and the prefill rank's engine id."""

    name: ClassVar[str] = "mooncake"
    has_prefill: ClassVar[bool] = True
    discovers_ranks: ClassVar[bool] = True
    holds_prefill_open: ClassVar[bool] = False

    def prefill_params(self, transfer_id: str) -> dict[str, Any]:
        return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}

    def decode_params(self, reply: dict[str, Any], transfer_id: str, bootstrap_addr: str,
                      engine_id: str | None) -> dict[str, Any] | None:
        return {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_bootstrap_addr": bootstrap_addr, "remote_engine_id": engine_id,
                "transfer_id": transfer_id}

    @staticmethod
    async def query_engine_ids(client: httpx.AsyncClient, bootstrap_addr: str,
                               timeout: float) -> dict[int, str] | None:
        """``{dp_rank: engine_id}`` from a bootstrap server's ``/query``, or ``None``."""
        try:
            resp = await client.get(bootstrap_addr + "/query", timeout=timeout)
            data = resp.json() if resp.status_code == 200 else None
            ids = {int(rank): str(entry["engine_id"]) for rank, entry in data.items()}
        except (httpx.HTTPError, ValueError, TypeError, KeyError, AttributeError):
            return None
        return ids or None


class NoPrefill:
    """No prefill stage: s_i is estimated, then corrected from decode's first usage."""

    name: ClassVar[str] = "none"
    has_prefill: ClassVar[bool] = False
    discovers_ranks: ClassVar[bool] = False
    holds_prefill_open: ClassVar[bool] = False

    def prefill_params(self, transfer_id: str) -> dict[str, Any]:
        raise RuntimeError("the 'none' dialect has no prefill stage")

    def decode_params(self, reply: dict[str, Any], transfer_id: str, bootstrap_addr: str,
                      engine_id: str | None) -> dict[str, Any] | None:
        return None


KV_DIALECTS: dict[str, type] = {"nixl": NixlDialect, "mooncake": MooncakeDialect, "sglang": SglangDialect,
                                "none": NoPrefill}


def get_dialect(name: str) -> KvDialect:
    """The dialect called ``name`` (the valid names listed when it is unknown)."""
    try:
        return KV_DIALECTS[name]()
    except KeyError:
        raise ValueError(f"unknown kv_dialect {name!r}; valid: {', '.join(KV_DIALECTS)}") from None
