"""What a person reads of a job's log: the log without banners third-party packages print on import (AutoAWQ's
deprecation notice is most of an engine check's log). The stored log keeps every line; pages offer it whole."""
import re

# (a line that opens the banner, a line that closes it, what the page says instead)
BANNERS = (
    (re.compile(r"awq/__init__\.py:\d+: DeprecationWarning"), re.compile(r"warnings\.warn\(_FINAL_DEV_MESSAGE"),
     "(AutoAWQ's deprecation notice left out: it is in the full log)"),
)


def log_without_banners(text):
    """The log with each known banner replaced by one line that says it was left out."""
    lines, shown, index = text.splitlines(), [], 0
    while index < len(lines):
        banner = next((banner for banner in BANNERS if banner[0].search(lines[index])), None)
        if banner is None:
            shown.append(lines[index])
            index += 1
            continue
        end = next((i for i in range(index, min(index + 40, len(lines))) if banner[1].search(lines[i])), None)
        if end is None:  # not the banner we know (or cut off): show it as it is
            shown.append(lines[index])
            index += 1
            continue
        shown.append(banner[2])
        index = end + 1
    return "\n".join(shown)
