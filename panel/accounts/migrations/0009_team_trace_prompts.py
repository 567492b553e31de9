from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0008_team_gpu_quota'),
    ]

    operations = [
        migrations.AddField(
            model_name='team',
            name='trace_prompts',
            field=models.BooleanField(default=False),
        ),
    ]
