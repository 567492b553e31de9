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


@register.filter(name="params")
def params(value):
    """5.2M, 1.54B."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "—"
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if number >= threshold:
            return f"{number / threshold:.2f}".rstrip("0").rstrip(".") + suffix
    return f"{number:.0f}"


@register.filter(name="percent")
def percent(value):
    try:
        return f"{float(value) * 100:.0f}%"
    except (TypeError, ValueError):
        return "—"


@register.filter(name="signed_percent")
def signed_percent(value):
    """A change already in percent, with its sign: +19.4%, -0.3%, +0.0% (never "-0.0%")."""
    try:
        return f"{round(float(value), 1) or 0.0:+.1f}%"
    except (TypeError, ValueError):
        return "—"


@register.filter(name="whole")
def whole(value):
    """A count in full, with thousands separators: 1,234,567 ("—" for none)."""
    try:
        return f"{int(value):,}"
    except (TypeError, ValueError):
        return "—"


@register.filter(name="tokens")
def tokens(value):
    """1.2M, 350K, 900."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return "—"
    if number >= 1_000_000:
        return f"{number / 1e6:.1f}M"
    if number >= 10_000:
        return f"{number / 1e3:.0f}K"
    return f"{number:,}"


@register.filter(name="reduction")
def reduction(result):
    """The size reduction of a quantization result, as a percentage."""
    try:
        return percent(1 - result["size_after_bytes"] / result["size_before_bytes"])
    except (KeyError, TypeError, ZeroDivisionError):
        return "—"


@register.filter(name="duration")
def duration(seconds):
    """45 s, 12 min, 3 h 5 min."""
    try:
        seconds = int(seconds)
    except (TypeError, ValueError):
        return "—"
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


@register.filter(name="money")
def money_filter(value):
    """A sum of money as the panel writes it everywhere ('1,234.56', '0.0048', '0.000035'; core/money.py), from a
    number or the plain decimal text a job's result keeps; '—' for none."""
    from decimal import Decimal, InvalidOperation

    from panel.core.money import money_text

    if value is None or value == "":
        return "—"
    try:
        return money_text(Decimal(str(value)))
    except InvalidOperation:
        return value
