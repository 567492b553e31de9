import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('dashboards', '0003_rollup_cache_writes'),
        ('serving', '0005_deployment_replicas'),
    ]

    operations = [
        migrations.CreateModel(
            name='LocalCostWatermark',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('allocated_since', models.BigIntegerField()),
                ('allocated_until', models.BigIntegerField()),
                ('checked_id', models.BigIntegerField(default=0)),
                ('deployment', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='serving.deployment')),
            ],
        ),
    ]
