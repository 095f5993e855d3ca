from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0021_card_faults_and_health_breaker"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="card_checks",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
