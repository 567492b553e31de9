from django.contrib import admin

from panel.hosts.models import EngineCheck, WorkerHost


@admin.register(WorkerHost)
class WorkerHostAdmin(admin.ModelAdmin):
    list_display = ["name", "host", "kind", "cpu_count", "last_seen"]


@admin.register(EngineCheck)
class EngineCheckAdmin(admin.ModelAdmin):
    list_display = ["id", "host", "team", "state", "created_at"]
    list_filter = ["state"]
