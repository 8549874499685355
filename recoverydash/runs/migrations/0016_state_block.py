"""StateBlock: the time blocks of a format 6 ledger state (recovery.Ledger.to_parts); an
analysis writes only those that changed. Existing states stay in Analysis.state whole (formats
4 and 5 load and are continued) until their next write."""


import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0015_analysis_clock_basis'),
    ]

    operations = [
        migrations.CreateModel(
            name='StateBlock',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('attempt', models.IntegerField()),
                ('block', models.BigIntegerField()),
                ('data', models.BinaryField()),
                ('analysis', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='blocks', to='runs.analysis')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('analysis', 'attempt', 'block'), name='uniq_state_block')],
            },
        ),
    ]
