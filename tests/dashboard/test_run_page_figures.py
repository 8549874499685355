"""The run page's time charts share one window and scale their y axis to the data (the TSLRC
limit drawn only when in view); a run with no generation gets an empty state, never an axis of
nothing; a file holding several components shows them; times say "just now" under a minute and
carry their UTC instant for the local-time toggle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from recoverydash.dashboard import charts
from recoverydash.dashboard.templatetags.dashboard import ago, ts

T = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)


def test_it_scales_the_tslrc_axis_to_the_data_and_names_a_limit_above_it():
    xs = [(T + timedelta(seconds=s)).isoformat() for s in (0, 60, 120)]
    fig = charts.tslrc_figure(xs, [0.0, 60.0, 120.0], 3600.0, (T, T + timedelta(seconds=120)))
    line, limit = fig["data"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "seconds"  # the data's unit, not the limit's
    assert fig["layout"]["yaxis"]["range"] == [0, 120.0 * 1.08]
    assert limit["visible"] is False and limit["meta"] == "limit"
    assert fig["layout"]["annotations"][0]["text"] == \
        "limit 3,600 seconds: above this range<br>(max_checkpoint_age_s = 3600)"
    assert fig["limit"]["y"] == 3600.0
    assert fig["time_axis"] is True
    assert fig["layout"]["xaxis"]["range"] == [T.isoformat(),
                                               (T + timedelta(seconds=120)).isoformat()]


def test_it_draws_the_limit_when_the_data_reaches_it():
    xs = [(T + timedelta(minutes=m)).isoformat() for m in (0, 30, 70)]
    fig = charts.tslrc_figure(xs, [0.0, 1800.0, 4200.0], 3600.0)
    line, limit = fig["data"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "minutes"
    assert limit["visible"] is True and limit["y"] == [60.0, 60.0]
    assert fig["layout"]["annotations"] == []
    assert fig["layout"]["yaxis"]["range"] == [0, 70.0 * 1.08]


def test_a_run_with_no_generation_gets_an_empty_generations_chart():
    fig = charts.generations_figure([], [], (T, T + timedelta(hours=1)))
    assert fig["empty"] is True and fig["data"] == []
    assert fig["layout"]["annotations"][0]["text"] == \
        "No checkpoint reported yet: no generation to draw."


@pytest.mark.django_db
def test_every_time_chart_of_a_run_spans_the_same_window(known_run):
    figures = charts.build_run_figures(known_run)
    timed = {name: f["layout"]["xaxis"]["range"] for name, f in figures.items()
             if f.get("time_axis")}
    assert set(timed) == {"generations", "tslrc", "cursors"}
    assert len({tuple(r) for r in timed.values()}) == 1
    start, _end = next(iter(timed.values()))
    assert start == known_run.first_event_at.isoformat()


def test_it_says_just_now_under_a_minute():
    assert ago(T, T + timedelta(seconds=59)) == "just now"
    assert ago(T + timedelta(seconds=5), T) == "just now"  # a trainer clock slightly ahead
    assert ago(T, T + timedelta(seconds=60)) == "1\xa0minute ago"
    assert ago(None) == ""


def test_it_renders_a_time_with_its_utc_instant():
    assert str(ts(T + timedelta(hours=1, seconds=2))) == (
        '<time class="ts" datetime="2026-11-01T01:00:02+00:00" data-date="1">'
        '2026-11-01 01:00:02 UTC</time>')
    assert str(ts("2026-11-01T01:00:02Z", "H:i:s")).endswith('data-date="0">01:00:02 UTC</time>')
    assert ts(None) == "—"


@pytest.mark.django_db
def test_a_file_holding_several_components_fills_each_cell_and_names_them(owner_client,
                                                                          known_run):
    from recoverydash.runs.models import CheckpointObject, Generation

    gen = Generation.objects.get(run=known_run, generation_id="g1250")
    uri = "file:///ckpt/g1250/last.ckpt"
    gen.manifest = dict(gen.manifest, required_shards=["rank0"],
                        components=["model", "optimizer", "scheduler"],
                        objects=[{"uri": uri, "shard": "rank0", "component": "model",
                                  "components": ["model", "optimizer", "scheduler"],
                                  "size": 10}])
    gen.save()
    gen.checkpoint_objects.all().delete()
    gen.shards.all().delete()
    CheckpointObject.objects.create(generation=gen, uri=uri, shard="rank0", component="model",
                                    size=10, in_manifest=True, check_status="ok")
    url = reverse("generation", args=[known_run.project.name, known_run.run_id, "g1250"])
    html = owner_client.get(url).content.decode()
    assert "model, optimizer, scheduler</span>" in html
    matrix = html.split('<table class="matrix">')[1].split("</table>")[0]
    assert matrix.count("absent") == 0 and matrix.count("✔") >= 3
