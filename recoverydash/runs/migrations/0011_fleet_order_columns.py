from django.db import migrations, models


def fill(apps, schema_editor):
    """Fill the new columns from what is stored: Run.max_checkpoint_age_s from the contract,
    Analysis.clock_since_s / clock_ended_s from the clock (runs.models.checkpoint_age_limit_of,
    clock_columns)."""
    from recoverydash.runs.models import checkpoint_age_limit_of, clock_columns

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
