from django.db import migrations, models

# Frozen here: a migration never imports live product code, whose later edits would change what
# this migration does to a database that applies it then. These are
# runs.models.checkpoint_age_limit_of and clock_columns as they were when this migration was
# frozen (issue 30); do not update them when those change.


def checkpoint_age_limit_of(contract):
    """The ``max_checkpoint_age_s`` a stored contract declares, when it is a number; else None."""
    value = contract.get("max_checkpoint_age_s") if isinstance(contract, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def clock_columns(clock):
    """``clock_since_s`` (the last restorable commit, else the first event) and
    ``clock_ended_s`` (the run's end) of a stored clock, POSIX seconds or None."""
    clock = clock if isinstance(clock, dict) else {}
    committed = (clock.get("last_restorable") or {}).get("committed_at")
    return {"clock_since_s": committed if committed is not None else clock.get("first_event_at"),
            "clock_ended_s": clock.get("ended_at")}


def fill(apps, schema_editor):
    """Fill the new columns from what is stored: Run.max_checkpoint_age_s from the contract,
    Analysis.clock_since_s / clock_ended_s from the clock (the frozen helpers above)."""
    Run = apps.get_model("runs", "Run")
    Analysis = apps.get_model("runs", "Analysis")
    for pk, contract in Run.objects.exclude(contract=None).values_list("pk", "contract").iterator():
        limit = checkpoint_age_limit_of(contract)
        if limit is not None:
            Run.objects.filter(pk=pk).update(max_checkpoint_age_s=limit)
    for pk, clock in Analysis.objects.values_list("pk", "clock").iterator():
        columns = clock_columns(clock)
        if any(v is not None for v in columns.values()):
            Analysis.objects.filter(pk=pk).update(**columns)


class Migration(migrations.Migration):
    """The columns the fleet orders by in SQL (dashboard.queries.fleet): the contract's
    checkpoint-age limit on Run, the clock's start and end on Analysis."""

    dependencies = [
        ('runs', '0010_analysis_compaction'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='max_checkpoint_age_s',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='analysis',
            name='clock_since_s',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='analysis',
            name='clock_ended_s',
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
