from datetime import UTC, datetime

import django.db.models.deletion
from django.db import migrations, models


def copy_maps(apps, schema_editor):
    """Every ``Attempt.rank_seen_at`` entry ({reporter: RFC 3339}) becomes a RankSeen row; an
    entry whose time does not parse is dropped (the map held only the server's own times)."""
    Attempt = apps.get_model("runs", "Attempt")
    RankSeen = apps.get_model("runs", "RankSeen")
    rows = []
    for pk, seen in Attempt.objects.exclude(rank_seen_at={}).values_list("pk", "rank_seen_at") \
            .iterator(chunk_size=200):
        for reporter, value in (seen or {}).items():
            try:
                at = datetime.fromisoformat(str(value))
            except ValueError:
                continue
            if at.tzinfo is None:
                at = at.replace(tzinfo=UTC)
            rows.append(RankSeen(attempt_id=pk, reporter=str(reporter)[:16], seen_at=at))
        if len(rows) >= 5000:
            RankSeen.objects.bulk_create(rows, batch_size=500)
            rows = []
    RankSeen.objects.bulk_create(rows, batch_size=500)


def copy_rows_back(apps, schema_editor):
    """The reverse: each attempt's rows as its ``rank_seen_at`` map again."""
    Attempt = apps.get_model("runs", "Attempt")
    RankSeen = apps.get_model("runs", "RankSeen")
    maps: dict = {}
    for pk, reporter, at in RankSeen.objects.values_list("attempt_id", "reporter", "seen_at"):
        maps.setdefault(pk, {})[reporter] = at.isoformat()
    for pk, seen in maps.items():
        Attempt.objects.filter(pk=pk).update(rank_seen_at=seen)


class Migration(migrations.Migration):
    """When each reporter of an attempt was last heard from: one RankSeen row per (attempt,
    reporter) instead of the attempt's ``rank_seen_at`` map (rewritten whole by every request:
    ~500 KB at 16,384 ranks). The map is copied into the rows, then removed."""

    dependencies = [
        ('runs', '0013_input_seq'),
    ]

    operations = [
        migrations.CreateModel(
            name='RankSeen',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name='ID')),
                ('reporter', models.CharField(max_length=16)),
                ('seen_at', models.DateTimeField()),
                ('attempt', models.ForeignKey(db_index=False,
                                              on_delete=django.db.models.deletion.CASCADE,
                                              related_name='ranks_seen_rows',
                                              to='runs.attempt')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('attempt', 'reporter'),
                                                        name='uniq_rank_seen')],
            },
        ),
        migrations.RunPython(copy_maps, copy_rows_back),
        migrations.RemoveField(
            model_name='attempt',
            name='rank_seen_at',
        ),
    ]
