from django import template

register = template.Library()

UNITS = ["B", "KiB", "MiB", "GiB", "TiB"]


@register.filter(name="bytes")
def human_bytes(value):
    """1.5 GiB, 512 MiB..."""
    try:
        size = float(value)
    except (TypeError, ValueError):
        return "—"
    for unit in UNITS:
        if abs(size) < 1024 or unit == UNITS[-1]:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return "—"


@register.filter(name="get")
def get_item(mapping, key):
    try:
        return mapping.get(key, "")
    except AttributeError:
        return ""


@register.filter(name="ago")
def ago(moment):
    """'12 s ago', '3 min ago', '2 h ago' — precise enough for heartbeats."""
    from django.utils import timezone

    if not moment:
        return "—"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    if seconds < 90:
        return f"{seconds} s ago"
    if seconds < 5400:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"
