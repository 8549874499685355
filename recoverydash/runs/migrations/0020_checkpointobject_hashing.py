from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0019_monitoring_pause'),
    ]

    operations = [
        migrations.AddField(
            model_name='checkpointobject',
            name='hashed_bytes',
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name='checkpointobject',
            name='hash_heartbeat_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
