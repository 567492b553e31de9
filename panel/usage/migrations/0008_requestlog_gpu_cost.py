from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('usage', '0007_tokens_estimated'),
    ]

    operations = [
        migrations.AddField(
            model_name='requestlog',
            name='gpu_cost',
            field=models.DecimalField(blank=True, decimal_places=8, max_digits=14, null=True),
        ),
    ]
