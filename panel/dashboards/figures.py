"""Plotly figures for the dashboards, built in Python from the selectors' plain data. The page hands the figure
JSON to the plotly.js served from the plotly package."""
from datetime import datetime, timezone

import plotly.graph_objects as go

COLORS = ("#2563eb", "#16a34a", "#ea580c", "#9333ea", "#0891b2", "#dc2626", "#ca8a04", "#4b5563")


def when(seconds):
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def figure(title, traces, *, y_title="", y_percent=False, barmode=None, empty="No data in this range yet"):
    fig = go.Figure(data=traces)
    fig.update_layout(title={"text": title, "x": 0, "font": {"size": 14}}, template="plotly_white", height=300,
                      margin={"l": 50, "r": 10, "t": 40, "b": 40}, legend={"orientation": "h", "y": -0.2},
                      yaxis={"title": y_title, "rangemode": "tozero", "ticksuffix": "%" if y_percent else ""},
                      barmode=barmode, hovermode="x unified")
    if not any(len(trace.x or ()) for trace in fig.data):
        fig.add_annotation(text=empty, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                           font={"color": "#6b7280"})
    return fig.to_plotly_json()


def line(name, xs, ys, index=0, *, dash=None, mode="lines+markers"):
    return go.Scatter(name=name, x=[when(x) for x in xs], y=ys, mode=mode,
                      line={"color": COLORS[index % len(COLORS)], "dash": dash}, connectgaps=False)


def bars(name, xs, ys, index=0, *, text=None):
    return go.Bar(name=name, x=xs, y=ys, marker={"color": COLORS[index % len(COLORS)]}, text=text,
                  textposition="auto")


def by_series(rows, key, value, names):
    """{series name: ([t...], [value...])} from rows that carry a series key."""
    series = {}
    for row in rows:
        xs, ys = series.setdefault(names(row[key]), ([], []))
        xs.append(row["t"])
        ys.append(value(row))
    return series
