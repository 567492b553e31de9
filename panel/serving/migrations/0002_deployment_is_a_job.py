# A deployment is a kind of job: it gains the job fields it lacked (progress, phase, result), and a stopped
# deployment gets the finished_at it never had (the cost of its GPU hours stops there): the time of its move to
# stopped in its history, else its last heartbeat.

from django.db import migrations, models


def stopped_deployments_finish(apps, schema_editor):
    Deployment = apps.get_model("serving", "Deployment")
    JobEvent = apps.get_model("jobs", "JobEvent")
    for deployment in Deployment.objects.filter(state="stopped", finished_at__isnull=True):
        stopped = (JobEvent.objects.filter(job_type="serving.deployment", job_id=deployment.pk, to_state="stopped")
                   .order_by("-at").values_list("at", flat=True).first())
        finished = stopped or deployment.heartbeat_at or deployment.ready_at or deployment.created_at
        Deployment.objects.filter(pk=deployment.pk).update(finished_at=finished)


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0001_initial'),
        ('serving', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='deployment',
            name='phase',
            field=models.CharField(blank=True, max_length=200),
        ),
        migrations.AddField(
            model_name='deployment',
            name='progress',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='deployment',
            name='result',
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(stopped_deployments_finish, migrations.RunPython.noop),
    ]
