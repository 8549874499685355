"""InputChunk and InputDigest: Analysis.inputs format 4 (runs.analysis.StoredInputs) keeps its
generation entries in chunk rows, read and written only when they change, and the first
occurrence of every state object digest. Stored inputs of format 3 (one blob) load and are
continued; their next write moves them into chunk rows."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0016_state_block'),
    ]

    operations = [
        migrations.CreateModel(
            name='InputChunk',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('chunk', models.BigIntegerField()),
                ('data', models.BinaryField()),
                ('analysis', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='input_chunks', to='runs.analysis')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('analysis', 'chunk'), name='uniq_input_chunk')],
            },
        ),
        migrations.CreateModel(
            name='InputDigest',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.BigIntegerField()),
                ('update', models.BigIntegerField()),
                ('generation', models.BigIntegerField()),
                ('analysis', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='input_digests', to='runs.analysis')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('analysis', 'key'), name='uniq_input_digest')],
            },
        ),
    ]
