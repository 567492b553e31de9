"""A dashboard table: its columns and rows, as the page shows them and as its CSV export writes them."""
from dataclasses import dataclass, field

from panel.core.money import Money, money_text


@dataclass
class Table:
    name: str
    title: str
    columns: list
    rows: list = field(default_factory=list)
    note: str = ""
    link: tuple | None = None  # (words, url): a page that goes further, beside the CSV export

    @property
    def display_rows(self):
        """Rows as the page shows them: (text, is a number); the CSV keeps the plain values."""
        return [[_display(value) for value in row] for row in self.rows]

    @property
    def headings(self):
        """(column, is a number column): a column is numeric when its values are."""
        shown = self.display_rows
        return [(column, bool(shown) and all(row[i][1] or row[i][0] in ("", "—") for row in shown)
                 and any(row[i][1] for row in shown)) for i, column in enumerate(self.columns)]

    @property
    def csv_rows(self):
        """Rows as the CSV writes them: money with the currency's precision (csv would write 3.5e-05)."""
        return [["" if value is None else str(value) if isinstance(value, Money) else value for value in row]
                for row in self.rows]


def _display(value):
    if value is None or value == "":
        return ("—" if value is None else "", False)
    if isinstance(value, Money):
        return (money_text(value), True)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (str(value), False)
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return (f"{int(value):,}", True)
    return (f"{value:,.6g}" if abs(value) < 1000 else f"{value:,.2f}", True)
