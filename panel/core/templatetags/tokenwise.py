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
