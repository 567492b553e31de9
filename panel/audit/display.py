"""An audit event's details as a person reads them on the audit page: each detail a short label and its value in
words (the CSV export keeps the details as recorded)."""
import json

VALUE_CHARS = 200  # a longer value (a canary's reason, a list of groups) is cut here on the page
MOST_ITEMS = 8  # a detail with more entries shows the first ones and how many more there are


def _words(value):
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        text = ", ".join(str(item) for item in value) or "—"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    else:
        text = str(value)
    return text if len(text) <= VALUE_CHARS else text[:VALUE_CHARS - 1] + "…"


def detail_items(detail):
    """[(label, value in words)] of an event's `detail`, in the order recorded; [] for none."""
    if not isinstance(detail, dict):
        return [("detail", _words(detail))] if detail else []
    items = [(str(name).replace("_", " "), _words(value)) for name, value in detail.items()]
    if len(items) > MOST_ITEMS:
        items = items[:MOST_ITEMS] + [("", f"and {len(items) - MOST_ITEMS} more in the CSV export")]
    return items
