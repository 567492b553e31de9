from django.contrib import admin

from panel.channels.models import Channel, Route, RouteChannel


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "kind", "base_url", "model_id", "credential_kind", "enabled", "misconfigured"]
    list_filter = ["team", "kind", "enabled"]
    # The ciphertext and the key's last four characters are never edited here: the panel's form encrypts keys.
    exclude = ["credential_ciphertext"]
    readonly_fields = ["credential_last4", "last_test", "last_tested_at", "misconfigured"]


class RouteChannelInline(admin.TabularInline):
    model = RouteChannel
    extra = 0


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    list_display = ["model_name", "team", "strategy", "fallback_on_error", "enabled"]
    list_filter = ["team", "strategy"]
    inlines = [RouteChannelInline]
