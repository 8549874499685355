"""What both framework callbacks hold: where to send, the sender and recorder once training
began, and a logger that says each failure once (a callback must never raise into training)."""

from __future__ import annotations

import logging
import os
from typing import Any

from recoverydash.recovery.contract import DEFAULT_REQUIRED_COMPONENTS
from recoverydash.sdk.client import Client
from recoverydash.sdk.observe import ObservedRecorder

log = logging.getLogger("recoverydash.integrations")


class Watch:
    """url, token, run_id: the server, an API token (scope ``ingest``; ``read`` too for the
    attempt rule to ask the server), the run (default ``$RECOVERYDASH_URL`` / ``_TOKEN`` /
    ``_RUN_ID``). dataset_version: identity of the training data (``attempt_started``,
    manifests). client: an existing ``Client`` (then url/token/run_id are not used). client_kw:
    more ``Client`` arguments (``spool_dir``, ``flush_interval``...). required_components: the
    contract's list, declared in ``attempt_started`` and written into manifests (default: what
    the framework knows the trainer saves, ``contract_for``: the spec's model, optimizer,
    scheduler, rng, data_progress, without scheduler for a trainer that has no LR
    scheduler)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 run_id: str | None = None, *, dataset_version: str | None = None,
                 client: Client | None = None, required_components: list | None = None,
                 **client_kw: Any):
        self.url = url or os.environ.get("RECOVERYDASH_URL")
        self.token = token or os.environ.get("RECOVERYDASH_TOKEN")
        self.run_id = run_id or os.environ.get("RECOVERYDASH_RUN_ID") or "run"
        self.dataset_version = dataset_version
        self.required_components = required_components
        self.client = client
        self.client_kw = client_kw
        self.recorder: ObservedRecorder | None = None
        self._errors: set = set()

    def _start_sending(self, rank: int, world_size: int, location: str | None,
                       restored: dict | None) -> None:
        """Create the client (the attempt rule, collective under torch.distributed: every rank
        calls this at the same point) and the observed recorder of this rank."""
        if self.client is None:
            self.client = Client(self.url, self.token, self.run_id, rank=rank, location=location,
                                 restored=restored, **self.client_kw)
        self.recorder = ObservedRecorder(self.client, rank=rank, world_size=world_size,
                                         dataset_version=self.dataset_version)

    def contract_for(self, has_scheduler: bool | None) -> dict[str, Any]:
        """The ``attempt_started`` fields that declare the contract the trainer's checkpoints
        meet: ``{"contract": {"required_components": [...]}}``, or ``{}`` when that is the
        default (then nothing is sent, and a contract edited on the run's contract page stays:
        an ``attempt_started`` carrying a contract replaces it). The list is
        ``required_components`` when given, else the default without ``scheduler`` when the
        framework says the trainer has no LR scheduler (``has_scheduler`` False; None: not
        known). Sets ``required_components``, which the manifests then carry."""
        if self.required_components is not None:
            required = list(self.required_components)
        else:
            required = [c for c in DEFAULT_REQUIRED_COMPONENTS
                        if c != "scheduler" or has_scheduler is not False]
        self.required_components = required
        if required == list(DEFAULT_REQUIRED_COMPONENTS):
            return {}
        return {"contract": {"required_components": required}}

    def _log_once(self, where: str, e: BaseException) -> None:
        if where not in self._errors:
            self._errors.add(where)
            log.warning("recoverydash: %s %s failed (logged once): %r", type(self).__module__,
                        where, e)
