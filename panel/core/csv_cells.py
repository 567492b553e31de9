"""CSV cells that a spreadsheet cannot run: a text cell starting with = + - @ (or a tab or carriage return, which
some spreadsheets skip before reading a formula) gets a leading apostrophe (OWASP's CSV injection advice)."""
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value):
    """`value` as written to a CSV export: numbers as they are, text neutralised."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_row(values):
    return [csv_cell(value) for value in values]
