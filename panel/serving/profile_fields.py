"""The fields of a serving profile, defined once: name, type, default, choices, bounds and the config.toml section
each belongs to. The Django model and form, the config.toml importer/exporter and the rules all read
these definitions, so a field is added or changed in one place.

A profile travels through the serving code as a plain dict keyed by the field names below."""
from dataclasses import dataclass

SECTIONS = ("model", "kv_cache", "batching", "parallel")  # config.toml's sections, in file order
BLOCK_SIZES = (8, 16, 32, 64, 128)
PORT_RANGE = (1024, 65535)


@dataclass(frozen=True)
class ProfileField:
    name: str  # key in a profile dict and the Django field name
    kind: type  # str, int, float or bool
    default: object
    label: str
    help: str = ""
    section: str | None = None  # config.toml section; None = not in config.toml
    toml_key: str | None = None  # key inside that section (defaults to name)
    choices: tuple = ()  # ((value, label), ...); empty = free value
    min_value: float | None = None
    max_value: float | None = None
    nullable: bool = False  # None is a valid value
    comment: str = ""  # the comment after the key in config.toml

    @property
    def key(self):
        """The key in config.toml (inside `section`)."""
        return self.toml_key or self.name

    @property
    def choice_values(self):
        return tuple(value for value, _ in self.choices)


FIELDS = (
    # [model]
    ProfileField("model_name", str, "", "Model", section="model", toml_key="name",
                 help="A hub id or a checkpoint path, as in config.toml's [model] name; matched to a registered "
                      "model."),
    ProfileField("dtype", str, "auto", "Data type", section="model",
                 comment="H100 可改 fp8",
                 choices=(("auto", "auto (the checkpoint's)"), ("float16", "float16"), ("bfloat16", "bfloat16")),
                 help="Activation precision. auto takes the checkpoint's own dtype."),
    ProfileField("quantization", str, "none", "Quantization", section="model",
                 comment="可选 awq / gptq / bitsandbytes",
                 choices=(("none", "none (FP16/BF16 weights)"), ("awq", "AWQ (INT4)"), ("gptq", "GPTQ"),
                          ("bitsandbytes", "bitsandbytes"), ("fp8", "FP8"),
                          ("compressed-tensors", "compressed-tensors (llm-compressor: W8A8, W4A16, FP8)")),
                 help="Must match an already-quantized checkpoint; AWQ and GPTQ need a quantized checkpoint "
                      "(it would quantize twice)."),
    ProfileField("quantization_bits", int, None, "Quantization bits", section="model", nullable=True,
                 choices=((4, "4"), (8, "8")), help="4 for AWQ/GPTQ INT4, 8 for FP8 or GPTQ INT8; empty for none."),
    ProfileField("max_model_len", int, 8192, "Max model length (tokens)", section="model",
                 comment="最大序列长度，按业务裁剪",
                 min_value=1, max_value=16 * 1024 * 1024,
                 help="Longest prompt + output per request. Trim it to what the workload needs: it sizes the KV "
                      "cache."),
    # [kv_cache]
    ProfileField("enable_prefix_caching", bool, True, "Prefix caching", section="kv_cache",
                 comment="共享 system prompt 时收益显著",
                 help="Reuses the KV cache of a shared prefix (a static system prompt)."),
    ProfileField("block_size", int, 16, "Block size (tokens)", section="kv_cache",
                 comment="PagedAttention 页大小",
                 choices=tuple((size, str(size)) for size in BLOCK_SIZES),
                 help="PagedAttention page size."),
    ProfileField("gpu_memory_utilization", float, 0.90, "GPU memory utilization", section="kv_cache",
                 comment="0.85-0.92 之间较稳",
                 min_value=0.0, max_value=1.0,
                 help="Share of each GPU's memory vLLM may take. 0.85-0.92 is the stable range."),
    ProfileField("swap_space", int, 0, "Swap space (GiB)", section="kv_cache",
                 comment="CPU 交换空间（GB）", min_value=0, max_value=4096,
                 help="Kept for config.toml files that have it. vLLM 0.32 has no CPU swap space (a preempted request "
                      "is recomputed), so this value is not passed to the engine."),
    # [batching]
    ProfileField("max_num_seqs", int, 256, "Max concurrent sequences", section="batching",
                 comment="最大并发序列数",
                 min_value=1, max_value=65536,
                 help="Large values raise throughput and P99 latency."),
    ProfileField("max_num_batched_tokens", int, 8192, "Max batched tokens per step", section="batching",
                 min_value=1, max_value=16 * 1024 * 1024),
    ProfileField("enable_chunked_prefill", bool, True, "Chunked prefill", section="batching",
                 comment="长 prompt 分块预填，降 TTFT",
                 help="Splits long prompts into chunks so they do not stall other requests' decoding."),
    # [parallel]
    ProfileField("tensor_parallel_size", int, 1, "Tensor parallel size (GPUs)", section="parallel",
                 comment="张量并行卡数",
                 min_value=1, max_value=512, help="Must split the model's attention and KV heads evenly."),
    ProfileField("pipeline_parallel_size", int, 1, "Pipeline parallel size", section="parallel",
                 min_value=1, max_value=512),
    # Not in config.toml.
    ProfileField("served_model_name", str, "", "Served model name",
                 help="The name clients send as `model`. Empty: the model name."),
    ProfileField("port", int, None, "Port", nullable=True, min_value=PORT_RANGE[0], max_value=PORT_RANGE[1],
                 help="Empty: a free port is picked at launch."),
    ProfileField("tool_call_parser", str, "", "Tool calling",
                 choices=(("", "off"), ("hermes", "hermes (Qwen 2.5, Hermes)"),
                          ("llama3_json", "llama3_json (Llama 3.1-3.3)"), ("pythonic", "pythonic (Llama 3.2, 4)"),
                          ("mistral", "mistral"), ("granite", "granite"), ("qwen3_coder", "qwen3_coder"),
                          ("deepseek_v3", "deepseek_v3"), ("openai", "openai (gpt-oss)")),
                 help="vLLM's automatic tool choice, with the parser that reads the model family's tool calls: "
                      "what agents (Claude Code, OpenAI tools) need. Off: a request that lets the model call tools "
                      "goes to another channel of its route, or is refused in words."),
    ProfileField("sleep_after_minutes", float, None, "Sleep when idle (minutes)", nullable=True, min_value=0.1,
                 max_value=7 * 24 * 60,
                 help="After this many minutes without a request the engine stops and its GPU hours stop; the next "
                      "request wakes it (its route says whether that request waits or goes to the route's next "
                      "channel meanwhile). Empty: never sleeps."),
    ProfileField("extra_args", str, "", "Extra engine arguments",
                 help="More vLLM flags, shell-quoted, e.g. --enforce-eager. Flags the profile sets are refused."),
    ProfileField("name", str, "", "Profile name"),
)

FIELDS_BY_NAME = {field.name: field for field in FIELDS}
TOML_FIELDS = tuple(field for field in FIELDS if field.section)


def section_fields(section):
    """The fields of one config.toml section, in file order."""
    return tuple(field for field in TOML_FIELDS if field.section == section)


def defaults():
    """A new profile dict with every field at its default."""
    return {field.name: field.default for field in FIELDS}


PRESETS = {
    "low_latency": {
        "label": "Low latency",
        "description": "Few concurrent sequences and a small per-step token budget, so short interactive requests "
                       "are not queued behind long ones (run a low-latency instance beside a "
                       "high-throughput one).",
        "values": {"max_num_seqs": 16, "max_num_batched_tokens": 2048, "enable_chunked_prefill": True,
                   "enable_prefix_caching": True},
    },
    "high_throughput": {
        "label": "High throughput",
        "description": "Many concurrent sequences for batch jobs; P99 latency rises with max_num_seqs, so keep "
                       "interactive traffic on a low-latency instance.",
        "values": {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_chunked_prefill": True,
                   "enable_prefix_caching": True},
    },
}
