from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('usage', '0003_attempt_trail_and_request_id'),
    ]

    operations = [
        migrations.AddField(
            model_name='requestlog',
            name='cache_write_tokens',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
    ]
