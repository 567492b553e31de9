"""Launching a config ladder or a max_num_seqs sweep from its valid form: the page and the API share these, so both
launch the same thing from the same checks."""
from panel.benchmarks import ladder as ladders


def ladder_from_form(*, team, user, form):
    data = form.cleaned_data
    return ladders.ladder_launch(
        team=team, user=user, model=data["model"], small_max_num_seqs=data["small_max_num_seqs"],
        large_max_num_seqs=data["large_max_num_seqs"], max_model_len=data["max_model_len"],
        extra_args=data["extra_args"], gpu_price_per_hour=data["gpu_price_per_hour"] or 0,
        repeats=data.get("repeats") or 3,
        **form.workload_values())


def sweep_from_form(*, team, user, form):
    data = form.cleaned_data
    return ladders.sweep_launch(team=team, user=user, profile=data["profile"], values=data["values"],
                                p99_target_ms=data["p99_target_ms"], repeats=data.get("repeats") or 1,
                                **form.workload_values())
