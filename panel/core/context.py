from django.urls import reverse

from panel.core.sections import SECTIONS

WORKERS = {"slug": "hosts", "title": "Workers", "icon": "⚙"}


def navigation(request):
    """The sidebar: each section with its URL and whether the current page is in it."""
    items = [{"slug": s.slug, "title": s.title, "icon": s.icon} for s in SECTIONS] + [WORKERS]
    for item in items:
        item["url"] = reverse(item["slug"])
        item["active"] = request.path.startswith(item["url"])
    return {"nav_sections": items}
