"""The sections of the navigation, in order: each slug is the URL name of the section's own page, the summary is
what the overview page says about it, and the action (panel/accounts/roles.py) is what a role needs to open it:
the sidebar shows a section only to the roles that may."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    slug: str
    title: str
    icon: str
    summary: str
    action: str = ""  # empty: "<slug>.view"

    @property
    def view_action(self):
        return self.action or f"{self.slug}.view"


SECTIONS = [
    Section("models", "Models", "◆", "Registered models with their memory cost: weights at FP16, FP8 and INT4, "
            "KV cache per token, and what fits on which GPU. Quantized children appear under their parent."),
    Section("quantization", "Quantization", "◇", "Quantization jobs on GPU workers (llm-compressor or AutoAWQ: W8A8, "
            "FP8, 4-bit AWQ/GPTQ, mixed precision) with live progress, logs and the size each one saved, each "
            "followed by a quality report against its parent.", action="models.view"),
    Section("serving", "Serving", "▶", "Serving profiles (vLLM's config.toml as a form: quantization, block "
            "size, gpu_memory_utilization, max_num_seqs, prefix caching...) and the vLLM deployments launched "
            "from them, supervised by the workers."),
    Section("channels", "Channels", "⇄", "OpenAI-compatible upstreams: local vLLM deployments and cloud providers "
            "such as TaoToken, with encrypted credentials, prices, and a Test button that diagnoses 401/404/"
            "connection errors in words."),
    Section("keys", "Gateway keys", "◈", "One key per team for the unified gateway at /v1: shown once, stored as "
            "a hash, with model allow-lists, expiry and per-minute limits."),
    Section("dashboards", "Dashboards", "▤", "Live usage, TTFT, prefix-cache hit rate and cost per million tokens, "
            "local against cloud, with the savings against an all-cloud baseline.", action="usage.view"),
    Section("compare", "Compare", "◫", "The same prompt to the local model and to the cloud model, streamed side "
            "by side with TTFT, tokens/s, tokens and cost per column; JSON and prefix-cache checks."),
    Section("evaluations", "Evaluations", "✓", "Evaluation sets: the team's own prompts with checks a machine runs "
            "on every answer (JSON that parses and fits a schema, a pattern, a value, agreement with a reference "
            "channel), versioned, to judge whether a cheaper model is still good enough."),
    Section("benchmarks", "Benchmarks", "◔", "Benchmark runs, the config ladder (FP16 → AWQ → prefix cache → "
            "batching) with this machine's real numbers, and the max_num_seqs sweep."),
    Section("advisor", "Advisor", "✦", "Concrete recommendations read from your traffic, engine metrics and "
            "serving profiles, each with its evidence and the fix; canary rollouts of a candidate channel with "
            "automatic rollback."),
    Section("audit", "Audit", "☰", "An append-only record of sign-ins, key and credential changes, role changes, "
            "job launches and deployment starts and stops: who, when, from where."),
]
