"""Percentiles of a list of numbers, the one way the panel takes them from raw values."""


def percentile(values, p):
    """Linear interpolation between closest ranks (numpy's default), so p50 <= p90 <= p99 always holds; None for
    no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
