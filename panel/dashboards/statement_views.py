"""Provider statements: import a cloud provider's usage export for a channel and see it day by day against the usage
rows (panel/dashboards/statements.py)."""
from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.accounts.roles import may
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.channels.models import Channel
from panel.dashboards.models import ProviderStatement, StatementImport
from panel.dashboards.statements import MAX_BYTES, TOLERANCE_PERCENT, StatementError, statement_queue


class StatementForm(forms.Form):
    channel = forms.ModelChoiceField(queryset=Channel.objects.none(), label="Cloud channel",
                                     help_text="The channel the provider billed: its model's lines are compared.")
    file = forms.FileField(label="The provider's usage export (CSV)",
                           help_text="One line per day (or per hour, or per model): a day or a time, input and "
                                     "output tokens; requests and cost where the export has them.")

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["channel"].queryset = Channel.objects.filter(team=team, kind="remote").order_by("name")


def _page(request, form=None, status=200):
    return render(request, "dashboards/statements.html", {
        "form": form or StatementForm(team=request.team), "tolerance": TOLERANCE_PERCENT,
        "can_import": may(request.membership, "statements.import"),
        "statements": ProviderStatement.objects.filter(team=request.team)[:20],
        "imports": StatementImport.objects.filter(team=request.team, statement__isnull=True)[:5]}, status=status)


@team_view("usage.view")
def statement_list(request):
    return _page(request)


@require_POST
@team_view("statements.import")
def statement_upload(request):
    form = StatementForm(request.POST, request.FILES, team=request.team)
    if not form.is_valid():
        return _page(request, form, status=400)
    upload = form.cleaned_data["file"]
    try:
        job = statement_queue(team=request.team, channel=form.cleaned_data["channel"],
                              payload=upload.read(MAX_BYTES + 1), file_name=upload.name, user=request.user)
    except StatementError as error:
        form.add_error("file", str(error))
        return _page(request, form, status=400)
    audit_record(action=AuditAction.STATEMENT_IMPORTED, request=request, target=job.channel_name,
                 file=job.file_name, import_id=job.pk)
    return redirect("statement_import_detail", import_id=job.pk)


@team_view("usage.view")
def statement_import_detail(request, import_id):
    job = get_object_or_404(StatementImport, pk=import_id, team=request.team)
    if request.headers.get("X-Requested-With") == "fetch":  # the page's live region (static/js/live.js)
        return render(request, "dashboards/_statement_import.html", {"job": job})
    if job.statement_id:
        messages.success(request, f"Compared {len(job.statement.lines)} days of {job.file_name}: "
                                  + (f"{job.statement.differing_days} differ by more than {TOLERANCE_PERCENT:g}%."
                                     if job.statement.differing_days else "every day agrees."))
        return redirect("statement_detail", statement_id=job.statement_id)
    return render(request, "dashboards/statement_import.html", {"job": job})


@team_view("usage.view")
def statement_detail(request, statement_id):
    statement = get_object_or_404(ProviderStatement, pk=statement_id, team=request.team)
    return render(request, "dashboards/statement_detail.html", {"statement": statement,
                                                                 "tolerance": TOLERANCE_PERCENT})
