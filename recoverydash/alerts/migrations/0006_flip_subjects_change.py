from django.db import migrations, models


class Migration(migrations.Migration):
    """AlertFlip.change: the subjects an open alert gained or lost (a timeline entry and a
    notification whose state stays the same); None for a state change."""

    dependencies = [
        ('alerts', '0005_grouped_alerts_snapshots_runbooks'),
    ]

    operations = [
        migrations.AddField(
            model_name='alertflip',
            name='change',
            field=models.JSONField(blank=True, null=True),
        ),
    ]
