"""Every page renders the exact figures of a known stored analysis (``known_run``: the core's
output for scenario s2 plus a rejected g1255), and the run page shows exactly the core's numbers
for a scenario run through ingest and the analysis."""

from __future__ import annotations

import json
from datetime import UTC

import pytest
from django.urls import reverse

from tests.dashboard.conftest import without_definition_links

pytestmark = pytest.mark.django_db


def url_of(page, run, *more):
    """The URL of ``run``'s page named ``page``; ``more``: the restart or generation id."""
    return reverse(page, args=[run.project.name, run.run_id, *more])


def test_fleet_shows_the_run_with_health_age_generation_alerts_and_verdict(owner_client, known_run):
    html = owner_client.get("/").content.decode()
    assert "s2-omission" in html
    assert "Failing" in html
    assert "g1250" in html and "update 1,250" in html
    assert "1 open" in html
    assert "omission" in html
    assert "of 1h 00m" in html  # the limit beside the age


def test_run_page_states_the_three_answers_in_words(owner_client, known_run, known_result):
    html = without_definition_links(
        owner_client.get(url_of("run", known_run)).content.decode())
    assert "Can we resume?" in html and "Yes, from" in html and "g1250" in html
    assert "Update 1,250, committed 2026-11-01 00:21:01 UTC" in html
    assert known_result["updates_at_risk"] == 10
    assert "10 updates" in html and "over the limit" in html
    assert "What did the last restart do to the data?" in html
    assert "<strong>48</strong> omitted, <strong>0</strong> replayed, 0 recomputed" in html
    # goodput = 1,260 s on surviving updates / 1,396 s of wall time (the core's costs)
    assert known_result["costs"]["goodput"] == 1260 / 1396
    assert "90.3%" in html
    assert "restart_omission" in html


def test_run_page_embeds_every_figure_with_traces(owner_client, known_run):
    response = owner_client.get(url_of("run", known_run))
    figures = json.loads(json.dumps(response.context["charts"]))["figures"]
    assert set(figures) == {"generations", "tslrc", "cursors", "restart_positions",
                            "restart_seconds", "strata", "interval"}
    for name, fig in figures.items():
        assert fig["data"], name
    positions = {t["name"]: t["y"] for t in figures["restart_positions"]["data"]}
    assert positions == {"replayed": [0], "omitted": [48], "recomputed": [0]}
    assert b'id="figures-data"' in response.content


def test_charts_json_answers_the_same_figures(owner_client, known_run):
    data = owner_client.get(url_of("run_charts", known_run)).json()
    assert data["figures"]["strata"]["data"][1]["y"] == [pytest.approx(100 * 48 / 80688)]


def test_generation_page_lists_shards_components_objects_and_reasons(owner_client, known_run):
    ok = owner_client.get(url_of("generation", known_run, "g1250")).content.decode()
    assert "Objects (40)" in ok and "rank7" in ok and "data_progress" in ok
    assert "Restorable: committed" in ok
    bad = owner_client.get(url_of("generation", known_run, "g1255")).content.decode()
    assert "shard_missing" in bad and "no object for required shard rank7" in bad
    assert "object_missing" in bad and "no such file" in bad


def test_generation_page_names_the_contract_setting_of_a_missing_required_component(
        owner_client, known_run):
    from recoverydash.runs.models import Generation

    gen = Generation.objects.get(run=known_run, generation_id="g1250")
    gen.manifest = {**gen.manifest, "objects": [o for o in gen.manifest["objects"]
                                                if o["component"] != "scheduler"]}
    gen.status = "rejected"
    gen.reasons = [{"code": "component_missing", "detail": "no object for component scheduler"}]
    gen.save()
    url = url_of("generation", known_run, "g1250")
    html = owner_client.get(url).content.decode()
    assert ("The run's contract requires <code>scheduler</code> in every generation (its setting "
            "<code>required_components</code>: model, optimizer, scheduler, rng, data_progress)"
            in html)
    assert "If the trainer has no LR scheduler, nothing is missing" in html
    assert url_of("run_contract", known_run) in html
    # a generation rejected for another reason says nothing of the contract
    other = owner_client.get(reverse("generation", args=[known_run.project.name,
                                                         known_run.run_id, "g1255"]))
    assert "contract-missing" not in other.content.decode()


def test_generation_page_shows_the_notes_that_change_no_status(owner_client, known_run):
    from recoverydash.runs.models import Analysis
    analysis = Analysis.objects.get(run=known_run)
    note = {"code": "optimizer_stateless",
            "detail": "optimizer object file:///c/g1250/o has the same bytes (sha256) as in "
                      "generation g1200 (update 1200)"}
    for g in analysis.result["generations"]:
        if g["generation_id"] == "g1250":
            g["notes"] = [note]
    analysis.save(update_fields=["result"])
    html = owner_client.get(url_of("generation", known_run, "g1250")).content.decode()
    assert "Restorable: committed" in html and "Notes (they change no status)" in html
    assert "optimizer_stateless" in html and "as in generation g1200 (update 1200)" in html


def test_restart_page_shows_cursors_findings_and_audit_windows(owner_client, known_run):
    html = owner_client.get(url_of("restart", known_run, 1)).content.decode()
    assert "epoch 0 · position 80,000" in html and "epoch 0 · position 80,048" in html
    assert "48 positions ahead: skipped" in html
    assert "48 positions skipped at the resume" in html  # the core's finding
    assert "Before the checkpoint" in html and "After the resume" in html
    assert "update 1250" in html and "update 1251" in html
    assert "s79872" in html  # (1249-1)*64 + 0 at update 1249, rank 0, slot 0


def test_live_fragments_render_only_the_live_region(owner_client, known_run):
    for url in ("/", url_of("run", known_run), reverse("alerts"),
                url_of("generation", known_run, "g1250")):
        response = owner_client.get(url, {"fragment": "live"})
        assert response.status_code == 200
        assert b"<html" not in response.content


def test_empty_fleet_says_how_to_send_the_first_events(owner_client):
    html = owner_client.get("/").content.decode()
    assert "No runs yet" in html and "/api/v1/events" in html and "Create a token" in html


def test_run_page_names_restorable_generations_outside_an_unknown_live_lineage(owner_client,
                                                                              known_run):
    """The live attempt resumed from a state that cannot be tied to g1250: the page must not say
    that nothing is restorable, nor claim g1250 for the live lineage."""
    from recoverydash.runs.models import Analysis

    analysis = Analysis.objects.get(run=known_run)
    analysis.result = dict(analysis.result, last_restorable=None)
    analysis.save()
    html = owner_client.get(url_of("run", known_run)).content.decode()
    assert "No restorable generation in the live lineage" in html
    assert "Restorable in another attempt&#x27;s lineage" in html or \
        "Restorable in another attempt's lineage" in html
    assert "restart from scratch" not in html


@pytest.mark.parametrize("mode, words", [
    ("observed", "<strong>observed</strong> positions (the samples that reached the model)"),
    ("counted", "<strong>counted</strong> (positions inferred from a sample count"),
])
def test_run_page_says_whether_the_ledger_was_observed_or_counted(owner_client, known_run,
                                                                  mode, words):
    from recoverydash.runs.models import Attempt

    Attempt.objects.filter(run=known_run, attempt=1).update(sampler={"ledger": mode})
    html = owner_client.get(url_of("run", known_run)).content.decode()
    assert f"Data ledger of attempt 1: {words}" in html


def test_run_page_says_nothing_of_the_ledger_when_the_trainer_did_not(owner_client, known_run):
    html = owner_client.get(url_of("run", known_run)).content.decode()
    assert "Data ledger of attempt" not in html


def test_the_run_page_shows_exactly_the_cores_numbers_for_scenario_s2(
        client, full_token, scenario_loader, tmp_path, owner, project, declare_location):
    """Scenario s2 through the real ingest API, the storage verifier and the worker's analysis
    (at a fixed time): the stored result is the core's output for the same events, and every
    number of the run page, words and figures, is the core's figure as the template renders it."""
    from datetime import datetime

    from recoverydash.dashboard.templatetags.dashboard import duration, num, percent
    from recoverydash.recovery import RunInput, analyze
    from recoverydash.recovery.figures import seconds_since_last_restorable
    from recoverydash.runs import analysis as worker
    from recoverydash.runs.models import Generation, Run
    from recoverydash.storage.verification import verify_generation
    from tests.dashboard.conftest import ANALYSED_AT, storage_checks

    events, _ = scenario_loader("s2_resume_at_read_cursor_omission", str(tmp_path))
    declare_location(project, tmp_path)  # the server reads checkpoints only there
    response = client.post("/api/v1/events", data=json.dumps({"events": events}),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {full_token}")
    assert response.status_code == 202, response.content
    run = Run.objects.get(run_id="s2-omission")
    for pk in Generation.objects.filter(run=run).values_list("pk", flat=True):
        verify_generation(pk)
    stored = worker.analyze(run, now=ANALYSED_AT.timestamp()).result
    core = analyze(RunInput.from_events(events, storage_checks(events)),
                   ANALYSED_AT.timestamp()).to_dict()
    assert stored == core

    client.force_login(owner)
    before = datetime.now(UTC)
    page = client.get(reverse("run", args=[run.project.name, run.run_id]))
    after = datetime.now(UTC)
    html = without_definition_links(page.content.decode())
    shown = page.context["s"].seconds_since_restorable
    assert seconds_since_last_restorable(core, before) <= shown \
        <= seconds_since_last_restorable(core, after)
    assert f"{duration(shown)} · {num(core['updates_at_risk'])} updates" in html
    last = core["last_restorable"]
    assert f"Yes, from <a href=\"/p/{run.project.name}/runs/{run.run_id}" \
           f"/generations/{last['generation_id']}/\">{last['generation_id']}</a>" in html
    assert f"Update {num(last['update'])}, committed 2026-11-01 00:21:01 UTC" in html
    [restart] = core["restarts"]
    assert (f"<strong>{num(restart['omitted'])}</strong> omitted, "
            f"<strong>{num(restart['replayed'])}</strong> replayed, "
            f"{num(restart['recomputed'])} recomputed") in html
    assert (f'<td class="num hide-sm">{duration(restart["lost_seconds"])}</td>'
            f'<td class="num hide-sm">{duration(restart["recovery_seconds"])}</td>') in html
    costs = core["costs"]
    for word, value in (("Goodput", percent(costs["goodput"])),
                        ("Mean time between failures", duration(costs["mtbf_seconds"])),
                        ("Measured save cost", duration(costs["median_save_seconds"])),
                        ("Young interval", duration(costs["young_interval_seconds"])),
                        ("Interval in use", duration(costs["observed_interval_seconds"]))):
        assert f"<dt>{word}</dt><dd>{value}</dd>" in html, word
    [stratum] = core["strata"]
    assert (f'<td>{stratum["stratum"]}</td><td class="num">{num(stratum["consumed"])}</td>'
            f'<td class="num">{num(stratum["duplicates"])}</td>'
            f'<td class="num">{num(stratum["omissions"])}</td>'
            f'<td class="num hide-sm">{percent(stratum["duplicate_rate"], 3)}</td>'
            f'<td class="num hide-sm">{percent(stratum["omission_rate"], 3)}</td>') in html

    figures = page.context["charts"]["figures"]
    line = figures["tslrc"]["data"][0]
    tooth = core["charts"]["tslrc"]
    assert line["x"][:len(tooth["time"])] == tooth["time"]
    div = {"hours": 3600.0, "minutes": 60.0, "seconds": 1.0}[
        figures["tslrc"]["layout"]["yaxis"]["title"]["text"]]
    assert line["y"][:len(tooth["seconds"])] == [round(v / div, 3) for v in tooth["seconds"]]
    assert round(seconds_since_last_restorable(core, before) / div, 3) <= line["y"][-1] \
        <= round(seconds_since_last_restorable(core, after) / div, 3)
    bars = {t["name"]: t["y"] for t in figures["restart_positions"]["data"]}
    assert bars == {k: [restart[k]] for k in ("replayed", "omitted", "recomputed")}
    rates = figures["strata"]["data"]
    assert rates[0]["y"] == [100.0 * stratum["duplicate_rate"]]
    assert rates[1]["y"] == [100.0 * stratum["omission_rate"]]


def test_the_run_and_restart_pages_say_tokens_for_a_token_stratum(owner_client, known_run):
    """docs/definitions.md#units: the core's ``units`` of a restart and of a stratum is what the
    pages call its counts."""
    from recoverydash.runs.models import Analysis

    analysis = Analysis.objects.get(run=known_run)
    analysis.result["restarts"][-1]["units"] = "tokens"
    for row in analysis.result["strata"]:
        row["units"] = "tokens"
    analysis.save()
    args = [known_run.project.name, known_run.run_id]
    html = without_definition_links(owner_client.get(reverse("run", args=args)).content.decode())
    assert "<strong>48</strong> omitted, <strong>0</strong> replayed, 0 recomputed tokens." in html
    assert '<span class="muted units">(tokens)</span>' in html
    page = without_definition_links(owner_client.get(
        reverse("restart", args=[*args, known_run.attempts.order_by("attempt").last().attempt]))
        .content.decode())
    assert "omitted tokens" in page and "replayed tokens" in page
    assert "omitted positions" not in page
    # the cursors of a token stratum, their difference and the words around them
    assert "epoch 0 · token 80,000" in page and "epoch 0 · token 80,048" in page
    assert "48 tokens ahead: skipped" in page and "48 positions ahead" not in page
    assert "else the first tokens it consumed." in page
    assert "counts the whole resume from the ledger's tokens:" in page
    assert "replayed and omitted tokens (defects) and recomputed tokens (the price" in html
    figure = json.loads(owner_client.get(reverse("run_charts", args=args)).content)
    restarts = figure["figures"]["restart_positions"]["layout"]
    assert (restarts["title"]["text"], restarts["yaxis"]["title"]["text"]) == (
        "Tokens per restart", "tokens")
