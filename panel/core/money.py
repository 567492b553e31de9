"""Money as people read it: the currency's two decimals, and more for sums below a cent (a request's price is
often a few millionths), never an exponent. One rule for pages, chart labels and CSV."""
import math

CURRENCY_DECIMALS = 2
MAX_DECIMALS = 8


def money_decimals(value):
    """Decimals that show a sum: two, or as many as keep two significant digits of a sum below a cent."""
    if not value or abs(value) >= 10 ** -CURRENCY_DECIMALS:
        return CURRENCY_DECIMALS
    return min(MAX_DECIMALS, max(CURRENCY_DECIMALS, 1 - math.floor(math.log10(abs(value)))))


def money_text(value, *, grouped=True):
    """'1,234.56', '0.0048', '0.000035'; '—' for None (unknown)."""
    if value is None:
        return "—"
    decimals = money_decimals(value)
    text = f"{value:,.{decimals}f}" if grouped else f"{value:.{decimals}f}"
    return "0.00" if float(value) == 0 else text


class Money(float):
    """A float that is a sum of money: tables show it with money_text, CSV writes it plain (no separators)."""

    def __str__(self):
        return money_text(self, grouped=False)


def money(value):
    return None if value is None else Money(value)
