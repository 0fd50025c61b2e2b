"""Several trainer ranks on one pool of vLLM servers: rank 0 leads, the others follow.

Under torchrun every rank builds a :class:`~ardea.rollout.engines.vllm.engine.VLLMEngine`
with ``spec.peers`` (:mod:`ardea.rollout.peers`) and sends its share of each rollout's
requests to the same servers. Rank 0's engine leads: it starts (or connects to) the servers,
loads every policy version into them and restarts those that died. A follower's engine
sends requests only. Their messages, by key:

- ``servers``: the leader's server URLs once they are up (or why they are not), which each
  follower then checks on its own (it must reach them: on several nodes a launched server
  listening on 127.0.0.1 is out of reach, and the error says so).
- ``paused/<v>/<rank>``: a follower's requests stopped between two tokens for version ``v``
  (its pool's counts ride along, so that the leader logs the job's totals).
- ``loaded/<v>``: the servers hold version ``v`` (each server's URL, None for one down), or
  why the load failed. The leader loads ``v`` only once every follower has paused, so no
  token of a follower is sampled while the weights change, and a follower publishes ``v``
  only after that load: every token is labelled with the weights that produced it, as in
  one process.

Both sides load the same sequence of versions (:attr:`VLLMEngine.shared`: a background
worker loads each published version in turn instead of skipping to the newest).
"""

from __future__ import annotations

import json
from typing import Any

from ardea.rollout.engines.vllm.server import VLLMServerError
from ardea.rollout.peers import EnginePeers

COUNTS = ("_requests", "_tokens", "retried_requests")  # pool metrics the job sums


class PeerSync:
    """This rank's side of the protocol above (``peers.rank`` 0 leads; alone, with no
    ``peers``, it leads and nothing is sent).

    Args:
        peers: the job's ranks that drive the pool (None: this process alone).
        start_wait_s: how long a follower waits for the leader's servers to start.
        load_wait_s: how long either side waits for the other at a weight load.
    """

    def __init__(
        self, peers: EnginePeers | None, *, start_wait_s: float, load_wait_s: float
    ) -> None:
        self.peers = peers
        self.start_wait_s, self.load_wait_s = start_wait_s, load_wait_s
        self.followed: dict[int, dict[str, float]] = {}  # the followers' last pool counts

    @property
    def shared(self) -> bool:
        """Whether several ranks drive the pool."""
        return self.peers is not None

    @property
    def leads(self) -> bool:
        return self.peers is None or self.peers.rank == 0

    # ------------------------------------------------------------------ servers
    def started(self, urls: list[str] | None, error: BaseException | None = None) -> None:
        """Leader: the servers are up at ``urls`` (or could not be: ``error``)."""
        self._post("servers", urls, error)

    def servers(self) -> list[str]:
        """Follower: the leader's server URLs (its error, raised here, when it has none)."""
        return self._wait("servers", self.start_wait_s, "start the vLLM servers")

    # ------------------------------------------------------------------ weights
    def pause(self, version: int, counts: dict[str, float]) -> None:
        """Follower: its requests are paused for ``version``."""
        self.peers.post(f"paused/{version}/{self.peers.rank}", json.dumps(counts))

    def wait_paused(self, version: int) -> None:
        """Leader: every follower's requests are paused for ``version``."""
        for rank in range(1, self.peers.world_size if self.shared else 1):
            text = self.peers.wait(f"paused/{version}/{rank}", self.load_wait_s)
            self.followed[rank] = json.loads(text)

    def loaded(
        self, version: int, urls: list[str | None] | None, error: BaseException | None = None
    ) -> None:
        """Leader: the servers hold ``version`` at ``urls`` (or the load failed: ``error``)."""
        self._post(f"loaded/{version}", urls, error)

    def wait_loaded(self, version: int) -> list[str | None]:
        """Follower: the servers' URLs once they hold ``version`` (the leader's error,
        raised here, when its load failed)."""
        return self._wait(f"loaded/{version}", self.load_wait_s, f"load version {version}")

    def totals(self, metrics: dict[str, float]) -> dict[str, float]:
        """Leader: ``metrics`` (its pool's) with the followers' counts added: the job's."""
        out = dict(metrics)
        for counts in self.followed.values():
            for key, value in counts.items():
                out[key] = out.get(key, 0.0) + value
        return out

    # ------------------------------------------------------------------ messages
    def _post(self, key: str, urls: Any, error: BaseException | None) -> None:
        if not self.shared:
            return
        problem = None if error is None else f"{type(error).__name__}: {error}"
        self.peers.post(key, json.dumps({"urls": urls, "error": problem}))

    def _wait(self, key: str, wait_s: float, what: str) -> Any:
        message = json.loads(self.peers.wait(key, wait_s))
        if message["error"] is not None:
            raise VLLMServerError(f"rank 0 could not {what}: {message['error']}")
        return message["urls"]


def counts(metrics: dict[str, float]) -> dict[str, float]:
    """The pool metrics that add up over the ranks (requests, tokens, retries)."""
    return {k: v for k, v in metrics.items() if k.endswith(COUNTS)}
