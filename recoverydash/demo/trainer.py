"""One rank of the demo's training job: a tiny DDP model on the CPU (gloo), ``DistributedSampler``,
gradient accumulation, DCP checkpoints published with the SDK (``save_generation``), the data ledger
*observed* by the SDK (``ObservedRecorder``: each sample carries its position through the loader
and is recorded where the model receives it), and fault hooks driven by ``cfg["fault"]``.

``launch(cfg, world)`` forks ``world`` ranks (the parent has imported torch already, so a rank
starts in milliseconds instead of importing torch again) and returns their exit codes.

Faults of attempt 0 (the rank that dies calls ``os._exit``: no cleanup, no atexit, as a SIGKILL;
it first flushes the events its SDK client already queued, so the counts the demo expects do not
depend on whether the client's 0.2 s send interval happened to pass before the kill):

- ``kill_before_shard``: rank 3 dies when the save of update ``fault_update`` begins, before it
  writes anything (the coordinator has reported ``checkpoint_started``).
- ``kill_mid_shard``: rank 3 dies while writing its ``data_progress`` file (its DCP files are on
  disk, the file is half written); ranks 0-2 report ``shard_written``. On S3 (where one PUT is
  all or nothing) its DCP files are uploaded and the torn write is an object holding the first
  half of the file's bytes, as a writer that streams its file and dies would leave.
- ``kill_before_commit``: every shard is written and reported; the coordinator dies just before it
  writes the manifest (the commit marker).
- ``kill_after_commit``: the coordinator writes the manifest, then dies before it reports
  ``checkpoint_committed``: only manifest discovery can tell the server.
- ``crash_mid_update``: rank 1 dies after it has read the first microbatch of update
  ``fault_update`` (its last heartbeat carries the read cursor); it also leaves a loader state file
  with the read cursor, as a prefetching loader's own state would.

Storage: ``cfg["location"]`` is a folder or, in the demo's S3 mode, ``s3://bucket/prefix/<run_id>``;
then ``cfg["s3"]`` holds ``make_s3_client`` arguments (endpoint, region, keys) and each rank makes
its own client after the fork, used for saving, selecting and loading (DCP stages its files in
``cfg["staging"]``).

Resume modes of attempt 1 (``cfg["resume"]``): ``checkpoint`` (the checkpoint's committed cursor:
exact), ``read_cursor`` (the loader state file: omission), ``older`` (one global batch behind the
checkpoint's cursor: replay), ``not_restored`` (the model and optimizer are restored, the loader's
position is not: it iterates the epoch from its start, a replay of everything the checkpoint had
consumed). The generation is chosen by the SDK's ``select_restorable``. In every mode the ledger
reports the positions the loader actually delivered: the faults are observed, not assumed.
"""

from __future__ import annotations

import json
import os
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

DATASET_VERSION = "demo-ds-1"


def _die(client=None, code: int = 17):
    try:
        if client is not None:
            client.flush(5)
    finally:
        os._exit(code)


def _install_save_fault(cfg: dict, rank: int, client):
    """Fault hooks inside the SDK's publication, for the save of update ``fault_update``."""
    from recoverydash.checkpoints import objects

    fault = cfg.get("fault")
    if fault == "kill_mid_shard" and rank == 3:
        original_put = objects.put_object

        def put_object(uri, data, **kw):
            if "/data_progress/" in uri:
                p = objects.parse_uri(uri)
                half = data[:len(data) // 2]  # half of the file, then the process is gone
                if p.scheme == "s3":
                    s3 = kw.get("s3_client") or objects.make_s3_client()
                    s3.put_object(Bucket=p.bucket, Key=p.key, Body=half)
                else:
                    os.makedirs(os.path.dirname(p.path), exist_ok=True)
                    with open(p.path, "wb") as f:
                        f.write(half)
                        f.flush()
                _die(client)
            return original_put(uri, data, **kw)

        objects.put_object = put_object
    elif fault in ("kill_before_commit", "kill_after_commit") and rank == 0:
        original_write = objects.write_manifest_atomically

        def write_manifest_atomically(location, manifest, **kw):
            if fault == "kill_before_commit":
                _die(client)
            out = original_write(location, manifest, **kw)
            _die(client)  # committed in storage; checkpoint_committed is never sent
            return out

        objects.write_manifest_atomically = write_manifest_atomically


def _resume(cfg: dict, model, opt, sched, positions, client, io_kw: dict) -> tuple[int, dict]:
    """A resumed attempt's restore: the newest restorable generation selected offline, loaded
    into ``model``, ``opt`` and ``sched``, and the loader told where to resume (unless the
    scenario's ``resume`` is one of the bugs it plays). Returns ``(update, resumed_from)``."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from recoverydash.sdk import load_generation, resumed_from, select_restorable

    sel = select_restorable(cfg["location"], s3_client=io_kw["s3_client"])  # offline: manifests
    if sel.restorable is None:
        raise RuntimeError("nothing restorable")
    msd, osd = get_state_dict(model, opt)
    small = load_generation(cfg["location"], sel.generation_id,
                            state={"model": msd, "optimizer": osd}, client=client,
                            **io_kw)
    if small.generation_id is None:
        raise RuntimeError("nothing restorable")
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    sched.load_state_dict(small["scheduler"])
    update = small.update
    cursor = [dict(c) for c in small.cursor]
    if cfg["resume"] == "read_cursor":      # the bug: the loader's own (read) position
        with open(cfg["loader_state"]) as f:
            cursor = json.load(f)["fetched"]
    elif cfg["resume"] == "older":          # the bug: a cursor one global batch behind
        gb = cfg["micro"] * cfg["accum"] * cfg["world_before"]
        cursor = [{**c, "position": max(0, c["position"] - gb)} for c in cursor]
    if cfg["resume"] != "not_restored":  # the bug: nothing tells the loader where it was
        positions.resume_at(cursor)
    start_from = resumed_from({"generation_id": small.generation_id, "update": update,
                               "cursor": cursor})
    return update, start_from


def rank_main(cfg: dict, rank: int, world: int) -> int:
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.utils.data import DistributedSampler, TensorDataset

    from recoverydash.integrations.pytorch import observed_loader
    from recoverydash.sdk import (
        Client,
        ObservedRecorder,
        make_generation_id,
        save_generation,
    )
    from recoverydash.sdk.observe import position_sampler_of

    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(cfg["master_port"])})
    torch.set_num_threads(1)
    # one short line per rank instead of the SDK's warnings
    if cfg.get("fault") and cfg.get("quiet_crash"):
        import logging

        logging.getLogger("recoverydash.sdk").setLevel(logging.ERROR)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    attempt = cfg["attempt"]
    fault = cfg.get("fault")
    fault_update = cfg.get("fault_update")
    accum = cfg["accum"]
    g = torch.Generator().manual_seed(1234)  # the locally made dataset: same on every rank
    n = cfg["n"]
    x_all = torch.randn(n, 8, generator=g)
    y_all = x_all @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    # the third tensor is the sample's identity, for the audit windows around checkpoints
    ds = TensorDataset(x_all, y_all, torch.arange(n))
    sampler = DistributedSampler(ds, shuffle=True, seed=7, drop_last=False)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    s3 = None  # the store's client in S3 mode: made here, after the fork, one per rank
    if cfg.get("s3"):
        from recoverydash.checkpoints.objects import make_s3_client

        s3 = make_s3_client(**cfg["s3"])
    io_kw = {"s3_client": s3, "staging_dir": cfg.get("staging")}
    client = Client(cfg["url"], cfg["token"], cfg["run_id"], attempt=attempt, rank=rank,
                    spool_dir=cfg["spool"], flush_interval=0.2)
    rec = ObservedRecorder(client, rank=rank, world_size=world, dataset_version=DATASET_VERSION,
                           heartbeat_interval=1.0)
    loader = observed_loader(rec, ds, sampler=sampler, batch_size=cfg["micro"])
    positions = position_sampler_of(loader)  # the PositionSampler around the DistributedSampler
    update, start_from = 0, None
    if cfg.get("resume"):
        update, start_from = _resume(cfg, model, opt, sched, positions, client, io_kw)
    rec.start(resumed_from=start_from, global_batch_size=cfg["micro"] * accum * world,
              micro_batch_size=cfg["micro"], grad_accum_steps=accum)
    first_epoch = positions.epoch
    resumed_at = update
    micro = 0
    slot_ids: list[list[int]] = []  # sample identities per accumulation slot of this update

    def audited(u: int) -> bool:
        """Readable identities (``audit_window``) for the update a checkpoint holds last, the two
        after it (what a resume from that checkpoint must deliver again: the restart page's
        expected window) and the first updates after a resume."""
        return (u % cfg["ckpt_every"] in (0, 1, 2)
                or bool(cfg.get("resume") and u <= resumed_at + 2))

    try:
        for epoch in range(first_epoch, cfg["epochs"]):
            positions.set_epoch(epoch)
            for batch in loader:
                if fault == "crash_mid_update" and rank == 1 and update + 1 == fault_update:
                    with open(cfg["loader_state"], "w") as f:
                        json.dump({"fetched": rec.fetched_cursor()}, f)
                    rec.heartbeat()
                    _die(client)
                x, y, ids = rec.observe(batch)  # the positions of what reaches the model
                torch.nn.functional.mse_loss(model(x), y).backward()
                slot_ids.append(ids.tolist())
                micro += 1
                if micro % accum:
                    continue
                opt.step()
                sched.step()
                opt.zero_grad()
                update += 1
                rec.commit(update)
                if audited(update):
                    for slot, sample_ids in enumerate(slot_ids):
                        client.audit_window(update, slot, sample_ids)
                slot_ids = []
                if cfg.get("stop_update") and update >= cfg["stop_update"]:
                    break
                if update % cfg["ckpt_every"] == 0:
                    if update == fault_update:
                        if fault == "kill_before_shard" and rank == 3:
                            _die(client)
                        _install_save_fault(cfg, rank, client)
                    msd, osd = get_state_dict(model, opt)
                    m = save_generation(cfg["location"], make_generation_id(update, attempt),
                                        update, state={"model": msd, "optimizer": osd},
                                        rank_state={"scheduler": sched.state_dict()},
                                        recorder=rec, **io_kw)
                    if m is None:  # a peer died during the save: this rank's job is over too
                        print(f"    rank {rank} stops: generation of update {update} not "
                              "published (a rank died during the save)", flush=True)
                        client.flush(5)
                        return 3
        if micro % accum:  # the last, partial accumulation is an update too
            opt.step()
            update += 1
            rec.commit(update)
    except Exception as e:  # noqa: BLE001 (a peer died, gloo says so: the job crashed)
        if fault is None or not cfg.get("quiet_crash"):
            traceback.print_exc()
        else:
            print(f"    rank {rank} stops: {type(e).__name__}: {str(e)[:90]}", flush=True)
        client.flush(5)
        return 4
    rec.end("completed")
    client.flush(10)
    dist.destroy_process_group()
    return 0


def _child(cfg: dict, rank: int, world: int):
    code = 1
    try:
        code = rank_main(cfg, rank, world)
    except BaseException:  # noqa: BLE001 (reported; the exit code says it)
        traceback.print_exc()
    finally:
        os._exit(code)


def launch(cfg: dict, world: int, timeout: float = 120.0) -> list[int]:
    """Fork ``world`` ranks running ``rank_main(cfg)``; their exit codes, in rank order."""
    import multiprocessing as mp

    from recoverydash.demo.util import free_port

    cfg = {**cfg, "master_port": free_port()}
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_child, args=(cfg, r, world), daemon=False) for r in range(world)]
    for p in procs:
        p.start()
    codes = []
    for p in procs:
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
        codes.append(p.exitcode)
    return codes
