"""Plotly figures for the dashboards, built in Python from the selectors' plain data as plotly figure dicts
(`{"data": [...], "layout": {...}}`, what `go.Figure.to_plotly_json()` gives), which the page hands to the
plotly.js served from the plotly package. They are written as dicts rather than through `go.Figure` because its
validation and template copy cost 70 ms a figure, a third of a page's budget; the tests load every figure back into
`go.Figure`, so a key plotly does not know still fails there."""
from datetime import datetime, timezone

COLORS = ("#2563eb", "#16a34a", "#ea580c", "#9333ea", "#0891b2", "#dc2626", "#ca8a04", "#4b5563")
GRID = "#eef0f3"
FONT = {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12, "color": "#374151"}


def when(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def _instant(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def figure(title, traces, *, y_title="", y_percent=False, y_money=False, barmode=None,
           empty="No data in this range yet", x_range=None):
    """`x_range`: (start, end) epoch seconds of a time axis. Set, the axis spans exactly the window drawn, so one
    point does not leave plotly to zoom into a millisecond around it. `y_money`: plain decimals on the axis
    (plotly's default wrote 0.0008 as "800μ")."""
    layout = {
        "title": {"text": title, "x": 0, "font": {"size": 14}}, "height": 300, "font": FONT,
        "margin": {"l": 55, "r": 10, "t": 40, "b": 40}, "legend": {"orientation": "h", "y": -0.2},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff", "hovermode": "x unified",
        "xaxis": {"gridcolor": GRID, "linecolor": "#d1d5db", "automargin": True},
        "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", "gridcolor": GRID, "zerolinecolor": "#d1d5db",
                  "ticksuffix": "%" if y_percent else ""},
    }
    if y_money:
        layout["yaxis"].update(tickformat=",.6~f", exponentformat="none")
    if x_range is not None:
        layout["xaxis"].update(type="date", range=[_instant(x_range[0]), _instant(x_range[1])], nticks=8)
    if barmode:
        layout["barmode"] = barmode
    if not any(len(trace.get("x") or ()) for trace in traces):
        layout["annotations"] = [{"text": empty, "showarrow": False, "xref": "paper", "yref": "paper", "x": 0.5,
                                  "y": 0.5, "font": {"color": "#6b7280"}}]
    return {"data": traces, "layout": layout}


def line(name, xs, ys, index=0, *, dash=None, mode="lines+markers", connect=False):
    """`connect`: join points across steps without a value (engine samples, stored coarser as they age, leave
    such steps; usage does not, so its empty steps stay gaps)."""
    style = {"color": COLORS[index % len(COLORS)], "width": 2}
    if dash:
        style["dash"] = dash
    return {"type": "scatter", "name": name, "x": [when(x) for x in xs], "y": ys, "mode": mode, "line": style,
            "marker": {"size": 4}, "connectgaps": connect}


def filled(series, steps, fill=0):
    """{name: (xs, ys)} with every step of the window, `fill` where a series has no value: a count with no rollup
    row in a step is a true zero, and drawn as one the series is a line even where traffic began a minute ago."""
    result = {}
    for name, (xs, ys) in series.items():
        values = dict(zip(xs, ys))
        result[name] = (list(steps), [values.get(t, fill) for t in steps])
    return result


def bars(name, xs, ys, index=0, *, text=None):
    trace = {"type": "bar", "name": name, "x": list(xs), "y": ys, "marker": {"color": COLORS[index % len(COLORS)]}}
    if text is not None:
        trace.update(text=text, textposition="auto")
    return trace


def by_series(rows, key, value, names):
    """{series name: ([t...], [value...])} from rows that carry a series key."""
    series = {}
    for row in rows:
        xs, ys = series.setdefault(names(row[key]), ([], []))
        xs.append(row["t"])
        ys.append(value(row))
    return series
