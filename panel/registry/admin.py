from django.contrib import admin

from panel.registry.models import QuantizationJob, RegisteredModel


@admin.register(RegisteredModel)
class RegisteredModelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "architecture", "parameter_count", "size_bytes", "parent"]
    list_filter = ["team"]


@admin.register(QuantizationJob)
class QuantizationJobAdmin(admin.ModelAdmin):
    list_display = ["id", "source", "team", "state", "progress", "created_at"]
    list_filter = ["state"]
