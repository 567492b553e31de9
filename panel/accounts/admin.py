from django.contrib import admin

from panel.accounts.models import InvitedAccount, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name"]
    inlines = [MembershipInline]


@admin.register(InvitedAccount)
class InvitedAccountAdmin(admin.ModelAdmin):
    """Where a superuser, having checked an invited account's address with its person, ticks email_verified."""
    list_display = ["user", "team_name", "invited_by", "email_verified", "created_at"]
    list_editable = ["email_verified"]
    readonly_fields = ["user", "team", "team_name", "invited_by", "created_at"]
    search_fields = ["user__username", "user__email", "team_name"]
