from django.db import migrations, models


class Migration(migrations.Migration):
    """Heartbeat.seq: the ingest seq of the batch that brought the heartbeat, so the analysis
    folds only heartbeats above the seq its state reflects. Rows from before carry 0: a state of
    an older format is rebuilt from every row, which reads them."""

    dependencies = [
        ('runs', '0005_storage_confinement'),
    ]

    operations = [
        migrations.AddField(
            model_name='heartbeat',
            name='seq',
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddIndex(
            model_name='heartbeat',
            index=models.Index(fields=['run', 'seq'], name='heartbeat_run_seq'),
        ),
    ]
