"""The vLLM flags a serving profile's extra_args may add, each with the values it accepts.

A profile's engine runs on a shared GPU host under the worker's account, so extra_args is an allow-list: flags that
tune the engine (numbers in range, choices, booleans), never ones that run code from a file or the checkpoint, open
the server to other origins, send data to another host, read a file outside the model's folder, or write prompts
and answers to the engine's log (the deployment's page shows it to the whole team). Anything not listed is refused
with the reason."""
import json
import os
import re

import jinja2

# Flags refused with a reason of their own (any other unlisted flag gets the general one).
REFUSED = {
    "--trust-remote-code": "runs Python code shipped with the checkpoint",
    "--tool-parser-plugin": "loads and runs a Python file",
    "--middleware": "imports and runs Python code in the server",
    "--worker-cls": "imports and runs Python code in the engine",
    "--worker-extension-cls": "imports and runs Python code in the engine",
    "--logits-processors": "imports and runs Python code in the engine",
    "--otlp-traces-endpoint": "sends traces (with request details) to another host",
    "--api-key": "the panel gives each deployment its own key",
    "--host": "the panel chooses where the engine listens",
    "--port": "the panel chooses the engine's port",
    "--uds": "the panel chooses where the engine listens",
    "--allowed-origins": "the engine is reached through the gateway, never from a browser",
    "--allowed-methods": "the engine is reached through the gateway, never from a browser",
    "--allowed-headers": "the engine is reached through the gateway, never from a browser",
    "--allow-credentials": "the engine is reached through the gateway, never from a browser",
    "--root-path": "the panel chooses the engine's paths",
    "--ssl-keyfile": "reads a file outside the model's folder",
    "--ssl-certfile": "reads a file outside the model's folder",
    "--ssl-ca-certs": "reads a file outside the model's folder",
    "--download-dir": "writes outside the model's folder",
    "--tokenizer": "reads another model's folder",
    "--lora-modules": "reads another model's folder",
    "--allowed-local-media-path": "lets requests read files of the host",
    "--allowed-media-domains": "lets requests make the engine fetch URLs from the GPU host's network (the panel's "
                               "engines fetch none: send media inline)",
    "--hf-overrides": "changes the checkpoint's configuration, including the code it runs",
    "--model-loader-extra-config": "passes settings to the weight loader",
    "--kv-transfer-config": "connects the engine to other hosts",
    "--enable-log-requests": "writes every request to the engine's log (its prompt at debug level), which anyone "
                             "in the team, viewers too, reads on the deployment's page",
    "--enable-log-outputs": "writes every answer to the engine's log, which anyone in the team, viewers too, reads "
                            "on the deployment's page",
    "--config": "the profile is the engine's configuration",
}
MAX_INT = 2 ** 31 - 1


def _int(low, high):
    def check(value):
        try:
            number = int(value)
        except ValueError:
            return f"takes a whole number, not {value!r}"
        return "" if low <= number <= high else f"takes a whole number from {low} to {high}"
    return check


def _number(low, high):
    def check(value):
        try:
            number = float(value)
        except ValueError:
            return f"takes a number, not {value!r}"
        return "" if low <= number <= high else f"takes a number from {low:g} to {high:g}"
    return check


def _choice(*choices):
    def check(value):
        return "" if value in choices else f"takes one of {', '.join(choices)}"
    return check


def _word(value):
    return "" if re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,30}", value) else "takes a short word"


def _speculative(value):
    """The n-gram proposer only: the other methods load a draft model from any path."""
    try:
        config = json.loads(value)
    except ValueError:
        return "takes a JSON object"
    if not isinstance(config, dict) or config.get("method") != "ngram":
        return "takes a JSON object with \"method\": \"ngram\" (the other methods load a draft model)"
    for key, item in config.items():
        if key == "method":
            continue
        if key not in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            return f"does not take the key {key!r} (num_speculative_tokens, prompt_lookup_max, prompt_lookup_min)"
        if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 16:
            return f"takes {key} as a whole number from 1 to 16"
    return ""


def _chat_template(value, model_path):
    """A Jinja template written inline (it must parse as one), or a file inside the model's folder (vLLM opens any
    path it is given)."""
    if "{{" in value or "{%" in value:
        if os.path.lexists(value):
            return "names a file whose name looks like a template: rename the file"
        try:
            jinja2.Environment().parse(value)
        except jinja2.TemplateSyntaxError as error:
            return f"is not a Jinja template: {error.message} (line {error.lineno})"
        return ""
    if not model_path:
        return "takes a template written inline, or a file in the model's folder"
    root = os.path.realpath(model_path)
    if not os.path.isabs(value) or os.path.commonpath([root, os.path.realpath(value)]) != root:
        return f"takes a template written inline, or the full path of a file inside the model's folder ({root})"
    return ""


BOOLEAN = None  # a flag that takes no value
ALLOWED = {
    "--enforce-eager": BOOLEAN,
    "--disable-log-stats": BOOLEAN,
    "--disable-custom-all-reduce": BOOLEAN,
    "--disable-sliding-window": BOOLEAN,
    "--async-scheduling": BOOLEAN,
    "--enable-auto-tool-choice": BOOLEAN,
    "--return-tokens-as-token-ids": BOOLEAN,
    "--enable-prompt-tokens-details": BOOLEAN,
    "--enable-expert-parallel": BOOLEAN,
    "--disable-fastapi-docs": BOOLEAN,
    "--seed": _int(-MAX_INT, 2 ** 32 - 1),
    "--max-log-len": _int(0, 1_000_000),
    "--max-logprobs": _int(-1, 100_000),
    "--num-gpu-blocks-override": _int(1, 10_000_000),
    "--max-parallel-loading-workers": _int(1, 64),
    "--data-parallel-size": _int(1, 64),
    "--long-prefill-token-threshold": _int(0, 10_000_000),
    "--cpu-offload-gb": _number(0, 4096),
    "--kv-cache-dtype": _choice("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    "--scheduling-policy": _choice("fcfs", "priority"),
    "--tokenizer-mode": _choice("auto", "slow", "mistral"),
    "--load-format": _choice("auto", "safetensors"),
    "--generation-config": _choice("auto", "vllm"),
    "--chat-template-content-format": _choice("auto", "string", "openai"),
    "--distributed-executor-backend": _choice("mp", "uni"),
    "--uvicorn-log-level": _choice("critical", "error", "warning", "info", "debug"),
    "--tool-call-parser": _choice("hermes", "llama3_json", "llama4_json", "mistral", "pythonic", "granite",
                                  "internlm", "jamba", "qwen3_coder", "qwen3_xml", "deepseek_v3", "kimi_k2",
                                  "openai", "glm45", "hunyuan_a13b", "phi4_mini_json"),
    "--reasoning-parser": _choice("deepseek_r1", "qwen3", "granite", "hunyuan_a13b", "mistral", "gpt_oss",
                                  "glm45", "step3"),
    "--response-role": _word,
    "--speculative-config": _speculative,
    "--chat-template": _chat_template,
}


# A value may start with "-" only as a negative number: anything else is what vLLM's parser reads as an option.
NEGATIVE_NUMBER = re.compile(r"-[0-9]+(\.[0-9]+)?")


def flag_tokens(tokens, *, model_path=None, engine_flags=None):
    """(arguments, problems): extra_args tokens (already split and free of owned flags) as vLLM will get them,
    each flag with its value in one `--flag=value` token so that no value can be read as an option, and the problems
    in words. `engine_flags`: the option strings the host's vLLM knows (its engine check), when known: an allowed
    flag that vLLM does not know is refused (argparse would take `--unknown= x` as a positional)."""
    arguments, problems = [], []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        flag, has_value, value = token.partition("=")
        name = "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag
        negative = name.startswith("--no-") and ALLOWED.get("--" + name[5:], 0) is BOOLEAN
        if name in REFUSED:
            problems.append(f"extra_args may not set {flag}: it {REFUSED[name]}")
            continue
        if name not in ALLOWED and not negative:
            problems.append(f"extra_args may not set {flag}: it is not among the engine flags Tokenwise allows "
                            f"({', '.join(sorted(ALLOWED))})")
            continue
        if engine_flags is not None and name not in engine_flags:
            problems.append(f"extra_args: {name} is not a flag of this host's vLLM: remove it")
            continue
        check = None if negative else ALLOWED[name]
        if check is BOOLEAN:
            if has_value:
                problems.append(f"extra_args: {flag} takes no value")
            else:
                arguments.append(name)
            continue
        if not has_value:
            if index >= len(tokens) or tokens[index].startswith("--"):
                problems.append(f"extra_args: {flag} needs a value")
                continue
            value = tokens[index]
            index += 1
        if value.startswith("-") and not NEGATIVE_NUMBER.fullmatch(value):
            problems.append(f"extra_args: the value of {flag} may not start with \"-\" (vLLM would read it as an "
                            "option)")
            continue
        problem = _chat_template(value, model_path) if name == "--chat-template" else check(value)
        if problem:
            problems.append(f"extra_args: {flag} {problem}")
        else:
            arguments.append(f"{name}={value}")
    return arguments, problems
