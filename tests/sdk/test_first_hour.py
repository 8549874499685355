"""A trainer's first hour with the SDK (issue 31): a plain loop without an LR scheduler is told at
its first save that its generations miss a required component, and by which contract setting
to say it has none; ``load_generation`` says what the generation holds that the given state dicts
had no place for (a fresh optimizer's ``state_dict()`` has no AdamW state)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from recoverydash.sdk.checkpoint import (  # noqa: E402
    load_generation,
    required_components_of,
    save_generation,
)
from recoverydash.sdk.client import Client  # noqa: E402
from recoverydash.sdk.guard import ONCE  # noqa: E402

WITHOUT_SCHEDULER = ["model", "optimizer", "rng", "data_progress"]


@pytest.fixture(autouse=True)
def _said_afresh():
    ONCE.reset()  # each test sees the warnings said once per process
    yield
    ONCE.reset()


def trained():
    """A model and AdamW after two steps (the optimizer holds exp_avg, exp_avg_sq, step)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def missing_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "which the run's contract requires"
            in r.getMessage()]


def test_a_loop_without_a_scheduler_is_warned_at_its_first_save_only(tmp_path, caplog):
    model, opt = trained()
    loc = str(tmp_path / "ckpt")
    for update in (10, 20):
        manifest = save_generation(loc, f"u{update}", update,
                                   state={"model": model.state_dict(),
                                          "optimizer": opt.state_dict()})
        assert manifest is not None  # published: the server's contract decides
        assert manifest["required_components"] == ["model", "optimizer", "scheduler", "rng",
                                                   "data_progress"]
    [said] = missing_warnings(caplog)
    assert said.startswith("recoverydash: generation u10 holds no scheduler, which the run's "
                           "contract requires (required_components: model, optimizer, "
                           "scheduler, rng, data_progress): the server rejects it "
                           "(component_missing)")
    assert "If the trainer has no LR scheduler, say so in the contract: leave scheduler out" \
        in said
    assert ('rec.start(contract={"required_components": ["model", "optimizer", "rng", '
            '"data_progress"]})') in said


def test_a_contract_without_the_scheduler_is_followed_by_the_manifests(tmp_path, caplog):
    client = Client(None, None, "first-hour", attempt=0, rank=0)
    client.attempt_started(world_size=1, dataset_version="d",
                           contract={"required_components": WITHOUT_SCHEDULER})
    assert client.contract == {"required_components": WITHOUT_SCHEDULER}
    assert required_components_of(None, client) == WITHOUT_SCHEDULER
    assert required_components_of(["model"], client) == ["model"]
    model, opt = trained()
    manifest = save_generation(str(tmp_path / "ckpt"), "u10", 10, client=client,
                               state={"model": model.state_dict(),
                                      "optimizer": opt.state_dict()})
    assert manifest["required_components"] == WITHOUT_SCHEDULER
    assert missing_warnings(caplog) == []


def test_load_generation_says_what_a_fresh_optimizers_state_dict_had_no_place_for(tmp_path,
                                                                                 caplog):
    model, opt = trained()
    loc = str(tmp_path / "ckpt")
    assert save_generation(loc, "u2", 2, state={"model": model.state_dict(),
                                                "optimizer": opt.state_dict()},
                           required_components=["model", "optimizer"]) is not None
    fresh_model = torch.nn.Linear(4, 2)
    fresh = torch.optim.AdamW(fresh_model.parameters(), lr=0.01)
    osd = fresh.state_dict()
    out = load_generation(loc, "u2", state={"model": fresh_model.state_dict(),
                                            "optimizer": osd}, restore_rng=False)
    assert out.generation_id == "u2" and osd["state"] == {}  # nothing of AdamW's state loaded
    assert out.unplaced == {"optimizer": [f"optimizer.state.{p}.{k}" for p in (0, 1)
                                          for k in ("exp_avg", "exp_avg_sq", "step")]}
    [said] = [r for r in caplog.records if "had no place for" in r.getMessage()]
    assert said.levelno == logging.WARNING
    assert said.getMessage().startswith(
        "recoverydash: generation u2 holds 6 entries of optimizer that the given state had no "
        "place for, so they were not loaded: optimizer.state.0.exp_avg, ")
    assert "get_state_dict(model, optimizer)" in said.getMessage()


def test_the_idiom_the_warning_names_loads_the_optimizer_state(tmp_path, caplog):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model, opt = trained()
    loc = str(tmp_path / "ckpt")
    msd, osd = get_state_dict(model, opt)
    assert save_generation(loc, "u2", 2, state={"model": msd, "optimizer": osd},
                           required_components=["model", "optimizer"]) is not None
    fresh_model = torch.nn.Linear(4, 2)
    fresh = torch.optim.AdamW(fresh_model.parameters(), lr=0.01)
    msd2, osd2 = get_state_dict(fresh_model, fresh)
    out = load_generation(loc, "u2", state={"model": msd2, "optimizer": osd2},
                          restore_rng=False)
    set_state_dict(fresh_model, fresh, model_state_dict=msd2, optim_state_dict=osd2)
    assert out.unplaced == {}
    assert not [r for r in caplog.records if "had no place for" in r.getMessage()]
    saved = opt.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(fresh.state_dict()["state"][0]["exp_avg"], saved)
