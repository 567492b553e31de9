"""The config ladder's table: one row per step with its measured figures, their spread over the repeats, the gain
over the step before and whether that gain is within the noise, the cost per million output tokens and the
quality report's numbers."""
import json
from decimal import Decimal

from panel.jobs.models import JobState
from panel.registry.quality import compare, latest_evaluation
from panel.serving.models import ServingProfile


def spread(values):
    """(mean, low, high) of the repeats' values; None when there are none."""
    if not values:
        return None
    return sum(values) / len(values), min(values), max(values)


def noise_verdict(current, previous):
    """Whether the difference between two steps' spreads means anything: "within noise" when their ranges over
    the repeats overlap (an identical repeat could have given the other result), "" when they are apart, and
    "one measurement" when a step was measured once (no spread to judge by)."""
    if current is None or previous is None:
        return ""
    if current[1] == current[2] or previous[1] == previous[2]:
        return "one measurement"
    overlap = current[1] <= previous[2] and previous[1] <= current[2]
    return "within noise" if overlap else ""


def _gain(current, previous):
    return f"{current / previous - 1:+.0%}"


def ladder_table(ladder, steps):
    """One row per step of `steps` ((key, label, what, use), ladder.STEPS)."""
    outcomes = {outcome["step"]: outcome for outcome in (ladder.result or {}).get("steps", [])}
    runs = {run.pk: run for run in ladder.runs.all()}
    profiles = {profile.pk: profile for profile in ServingProfile.objects.filter(
        pk__in=[o.get("profile_id") for o in outcomes.values() if o.get("profile_id")]).select_related("model")}
    price = ladder_price(ladder)
    rows, previous, baseline = [], None, None
    for key, label, what, use in steps:
        outcome = outcomes.get(key, {"status": "pending" if ladder.is_active else "not run", "reason": ""})
        run = runs.get(outcome.get("run_id"))
        step_runs = [runs[pk] for pk in outcome.get("run_ids") or ([run.pk] if run else []) if pk in runs]
        measured = [r for r in step_runs if r.state == JobState.SUCCEEDED]
        profile = profiles.get(outcome.get("profile_id"))
        row = {"key": key, "label": label, "what": what, "use": use, "status": outcome["status"],
               "reason": outcome.get("reason", ""), "run": run, "runs": step_runs, "profile": profile,
               "quality": step_quality(ladder.model, profile.model) if profile else None}
        throughputs = [r.result["output_throughput"] for r in measured]
        if throughputs:
            figures = measured[0].result
            current = spread(throughputs)
            throughput = current[0]
            medians = spread([r.result.get("median_ttft_ms") or 0 for r in measured])
            p99s = spread([r.result.get("p99_e2el_ms") or 0 for r in measured])
            row.update(throughput=throughput, low=current[1], high=current[2], repeats=len(throughputs),
                       figures=figures, median_ttft_ms=medians[0], p99_e2el_ms=p99s[0],
                       weights_bytes=profile.model.size_bytes if profile else None)
            devices = (profile.tensor_parallel_size * profile.pipeline_parallel_size) if profile else 1
            row["cost_per_million"] = cost_per_million(price, devices, throughput)
            if previous:
                row["gain_vs_previous"] = _gain(throughput, previous[0])
                row["noise"] = noise_verdict(current, previous)
            if baseline and previous is not baseline:
                row["gain_vs_baseline"] = _gain(throughput, baseline[0])
                row["noise_vs_baseline"] = noise_verdict(current, baseline)
            previous = current
            baseline = baseline or current
        rows.append(row)
    return rows


def step_quality(parent, model):
    """The quality report's numbers for the model a step served: its own measurement and, for a quantized
    child, the comparison with the ladder's model (None when it was never measured)."""
    evaluation = latest_evaluation(model)
    if evaluation is None:
        return None
    return compare(evaluation, latest_evaluation(parent) if model.pk != parent.pk else None)


def ladder_price(ladder):
    """The price of one GPU hour: the ladder's own, else the host's price when the hosts page records one."""
    if ladder.gpu_price_per_hour:
        return Decimal(ladder.gpu_price_per_hour)
    host_price = getattr(ladder.host, "gpu_price_per_hour", None) if ladder.host else None
    return Decimal(host_price) if host_price else Decimal(0)


def cost_per_million(price_per_hour, devices, tokens_per_second):
    """price per GPU hour × GPUs / millions of tokens per hour."""
    if not price_per_hour or not tokens_per_second:
        return None
    return float(price_per_hour) * devices / (tokens_per_second * 3600 / 1_000_000)


def ladder_figure(rows):
    """Mean output tokens/s by step, with the repeats' range as error bars."""
    import plotly.graph_objects as go

    measured = [row for row in rows if row.get("throughput")]
    figure = go.Figure(go.Bar(
        x=[row["label"] for row in measured], y=[row["throughput"] for row in measured],
        text=[f"{row['throughput']:.1f}" for row in measured], marker_color="#2f6fed",
        error_y=dict(type="data", symmetric=False, array=[row["high"] - row["throughput"] for row in measured],
                     arrayminus=[row["throughput"] - row["low"] for row in measured])))
    figure.update_layout(title="Output tokens per second by step (mean, range over the repeats)", yaxis_title="tok/s",
                         height=320, margin=dict(l=50, r=20, t=50, b=60))
    return json.loads(figure.to_json())
