from django.contrib import admin

from panel.jobs.models import JobEvent


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["job_type", "job_id", "from_state", "to_state", "actor", "at"]
    list_filter = ["job_type", "to_state"]
    readonly_fields = [f.name for f in JobEvent._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
