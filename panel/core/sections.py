"""The sections of the navigation. Until a section's feature lands, its page says what will appear there
and links to the first step."""
from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    slug: str
    title: str
    icon: str
    summary: str
    first_step: str
    first_step_url: str  # a URL name
    built: bool = False  # True once the section's own app serves its URL


SECTIONS = [
    Section("models", "Models", "◆", "Registered models with their memory cost: weights at FP16, FP8 and INT4, "
            "KV cache per token, and what fits on which GPU. Quantized children appear under their parent.",
            "Check that a GPU worker is online and its engine works", "hosts", built=True),
    Section("quantization", "Quantization", "◇", "AWQ quantization jobs (4-bit, group size 128, zero point, GEMM) "
            "running on GPU workers, with live progress, logs and the size each one saved.",
            "Register a model first", "models", built=True),
    Section("serving", "Serving", "▶", "Serving profiles (the seeds' config.toml as a form: quantization, block "
            "size, gpu_memory_utilization, max_num_seqs, prefix caching...) and the vLLM deployments launched "
            "from them, supervised by the workers.", "Register a model first", "models", built=True),
    Section("channels", "Channels", "⇄", "OpenAI-compatible upstreams: local vLLM deployments and cloud providers "
            "such as TaoToken, with encrypted credentials, prices, and a Test button that diagnoses 401/404/"
            "connection errors in words.", "Start a deployment, or add a cloud channel", "serving", built=True),
    Section("keys", "Gateway keys", "◈", "One key per team for the unified gateway at /v1: shown once, stored as "
            "a hash, with model allow-lists, expiry and per-minute limits.", "Add a channel first", "channels", built=True),
    Section("dashboards", "Dashboards", "▤", "Live usage, TTFT, prefix-cache hit rate and cost per million tokens, "
            "local against cloud, with the savings against an all-cloud baseline.",
            "Send traffic through the gateway with a team key", "keys", built=True),
    Section("compare", "Compare", "◫", "The same prompt to the local model and to the cloud model, streamed side "
            "by side with TTFT, tokens/s, tokens and cost per column; JSON and prefix-cache checks.",
            "Add two channels to compare", "channels", built=True),
    Section("benchmarks", "Benchmarks", "◔", "Benchmark runs, the config ladder (FP16 → AWQ → prefix cache → "
            "batching) with this machine's real numbers, and the max_num_seqs sweep.",
            "Start a deployment to benchmark", "serving", built=True),
    Section("advisor", "Advisor", "✦", "Concrete recommendations read from your traffic, engine metrics and "
            "serving profiles, each with its evidence and the fix; canary rollouts of a candidate channel with "
            "automatic rollback.", "Send traffic through the gateway with a team key", "keys", built=True),
    Section("audit", "Audit", "☰", "An append-only record of sign-ins, key and credential changes, role changes, "
            "job launches and deployment starts and stops: who, when, from where.",
            "Back to the overview", "home", built=True),
]

BY_SLUG = {section.slug: section for section in SECTIONS}
