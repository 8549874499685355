from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0006_heartbeat_seq'),
    ]

    operations = [
        migrations.AddField(
            model_name='attempt',
            name='rank_seen_at',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name='attempt',
            name='restore_failures',
            field=models.JSONField(blank=True, default=list),
        ),
    ]
