"""Alertmanager, Opsgenie and Teams endpoints; an endpoint's name unique within its project
(configuration files address endpoints by name). Endpoints that already share a name keep the
oldest one's, the others get " (2)", " (3)", ... appended before the constraint is added."""

from django.db import migrations, models


def rename_duplicates(apps, schema_editor):
    WebhookEndpoint = apps.get_model("alerts", "WebhookEndpoint")
    taken: dict[int, set[str]] = {}
    for endpoint in WebhookEndpoint.objects.exclude(name="").order_by("project_id", "pk"):
        names = taken.setdefault(endpoint.project_id, set())
        name, count = endpoint.name, 1
        while name in names:
            count += 1
            suffix = f" ({count})"
            name = endpoint.name[:100 - len(suffix)] + suffix
        names.add(name)
        if name != endpoint.name:
            endpoint.name = name
            endpoint.save(update_fields=["name"])


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0003_webhook_test_result'),
    ]

    operations = [
        migrations.AlterField(
            model_name='webhookendpoint',
            name='kind',
            field=models.CharField(choices=[('standard', 'Signed JSON (Standard Webhooks)'), ('slack', 'Slack incoming webhook'), ('pagerduty', 'PagerDuty Events v2'), ('alertmanager', 'Alertmanager-compatible webhook (version 4)'), ('opsgenie', 'Opsgenie Alert API v2'), ('teams', 'Microsoft Teams (Workflows, Adaptive Card)')], default='standard', max_length=16),
        ),
        migrations.RunPython(rename_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='webhookendpoint',
            constraint=models.UniqueConstraint(condition=models.Q(('name', ''), _negated=True), fields=('project', 'name'), name='uniq_endpoint_name'),
        ),
    ]
