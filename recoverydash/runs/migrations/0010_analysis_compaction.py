from django.db import migrations, models


class Migration(migrations.Migration):
    """Analysis.state_format (the format of the stored state) and Analysis.compacted_at (raw rows
    the state absorbed were deleted: docs/retention.md)."""

    dependencies = [
        ('runs', '0009_analysis_clock'),
    ]

    operations = [
        migrations.AddField(
            model_name='analysis',
            name='state_format',
            field=models.IntegerField(default=0),
        ),
        migrations.AddField(
            model_name='analysis',
            name='compacted_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
