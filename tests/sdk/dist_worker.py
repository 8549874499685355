"""One rank of a tiny DDP training run on the CPU (gloo), used by test_torch_distributed.py.

Run as ``python dist_worker.py '<json config>'`` with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
set. Config: location, url, token, run_id, attempt, spool, epochs, accum, micro, n, ckpt_every,
resume (bool), kill_rank / kill_update (that rank dies inside DCP's write during the save of that
update's generation), fail_upload_rank / fail_upload_update (that rank's S3 uploads raise during
that save), s3_endpoint (location is an s3:// prefix on that endpoint: moto's server), out
(folder for per-rank result JSON).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main(cfg: dict) -> int:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from recoverydash.checkpoints import objects as storage
    from recoverydash.sdk import (
        Client,
        CountingRecorder,
        SkipFirst,
        load_generation,
        make_generation_id,
        resumed_from,
        save_generation,
        select_restorable,
    )

    s3 = None
    if cfg.get("s3_endpoint"):
        s3 = storage.make_s3_client(cfg["s3_endpoint"], access_key_id="testing",
                                    secret_access_key="testing")
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n = cfg["n"]
    ds = TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    sampler = DistributedSampler(ds, shuffle=True, seed=11, drop_last=False)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3)
    client = Client(cfg["url"], cfg["token"], cfg["run_id"], attempt=cfg["attempt"], rank=rank,
                    spool_dir=cfg["spool"], flush_interval=0.2)
    rec = CountingRecorder.for_sampler(client, sampler, dataset_version="ds-1")
    update = 0
    skip = 0
    selection = None
    if cfg.get("resume"):
        selection = select_restorable(cfg["location"], world_size=world, s3_client=s3)
        msd, osd = get_state_dict(model, opt)
        small = load_generation(cfg["location"], selection.generation_id,
                                state={"model": msd, "optimizer": osd}, client=client,
                                s3_client=s3)
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        sched.load_state_dict(small["scheduler"])
        update = selection.update
        skip = rec.restore(selection.cursor, update)
    rec.start(resumed_from=resumed_from(selection), global_batch_size=cfg["micro"] * cfg["accum"]
              * world, micro_batch_size=cfg["micro"], grad_accum_steps=cfg["accum"])
    first_epoch = rec.epoch
    published = []
    micro = 0
    for epoch in range(first_epoch, cfg["epochs"]):
        sampler.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=cfg["micro"],
                            sampler=SkipFirst(sampler, skip, first_epoch))
        for x, y in rec.wrap(loader):
            torch.nn.functional.mse_loss(model(x), y).backward()
            micro += 1
            if micro % cfg["accum"]:
                continue
            opt.step()
            sched.step()
            opt.zero_grad()
            update += 1
            rec.commit(update)
            if cfg["ckpt_every"] and update % cfg["ckpt_every"] == 0:
                if rank == cfg.get("kill_rank") and update == cfg.get("kill_update"):
                    from torch.distributed.checkpoint import filesystem

                    def die(*a, **k):
                        os._exit(17)  # killed in the middle of the save, before publication

                    filesystem.FileSystemWriter.write_data = die
                if rank == cfg.get("fail_upload_rank") and update == cfg.get("fail_upload_update"):
                    def refuse(*a, **k):
                        raise storage.TransientStorageError("upload refused (test)")

                    storage.upload_file = refuse
                msd, osd = get_state_dict(model, opt)
                gen = make_generation_id(update, cfg["attempt"])
                m = save_generation(cfg["location"], gen, update,
                                    state={"model": msd, "optimizer": osd},
                                    rank_state={"scheduler": sched.state_dict()}, recorder=rec,
                                    s3_client=s3)
                if m is None:
                    _write(cfg, rank, {"update": update, "published": published,
                                       "failed_generation": gen})
                    client.flush(5)
                    return 3
                published.append(m["generation_id"])
    if micro % cfg["accum"]:  # the last, partial accumulation is an update too
        opt.step()
        update += 1
        rec.commit(update)
    rec.end("completed")
    client.flush(10)
    _write(cfg, rank, {"update": update, "published": published, "cursor": rec.cursor(),
                       "counters": client.counters()})
    dist.destroy_process_group()
    return 0


def _write(cfg, rank, doc):
    with open(os.path.join(cfg["out"], f"rank{rank}.json"), "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
