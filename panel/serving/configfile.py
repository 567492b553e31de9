"""A serving profile in and out of the files people use to run vLLM by hand: vLLM's config.toml layout, the
launch command as an argv and as vllm_deploy.sh, and a YAML file for vLLM's own `--config`.

Decisions:
- `quantization = "none"` is written out explicitly: the file then says what it means. A file without the key
  imports as "none" too. `quantization_bits = None` is left out (TOML has no null).
- Keys other than [model].name are optional on import; a missing key takes the field's default.
- vLLM 0.32 has no `--swap-space` (preempted requests are recomputed, not swapped to CPU): swap_space stays in
  config.toml (people's files have it) and is passed only to an engine that has the flag (`swap_space_flag=True`).
- YAML keys are the long flag names with dashes (`max-model-len`). vLLM turns a YAML `false` into `--no-<key>`
  only when that exact option exists, so an underscore key set to false would be silently dropped."""
import difflib
import json
import math
import re
import shlex
import tomllib

import yaml

from panel.serving.engine_flags import flag_tokens
from panel.serving.profile_fields import FIELDS_BY_NAME, SECTIONS, section_fields

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# What the panel starts its own engines with: vLLM's server behind a check, by vLLM's own parser, that the arguments
# set nothing but what their flags name (engine/serve.py).
CHECKED_SERVER_MODULE = "engine.serve"
# vLLM's --api-key guards only /v1 (and a few prefixes); this middleware (engine/api_key_guard.py, imported from the
# project root, the engines' working directory) puts every path behind the key: /invocations, /tokenize, /metrics...
KEY_GUARD = "engine.api_key_guard.ApiKeyGuard"
# A multimodal engine fetches the http(s) image, audio and video URLs a request names, from the GPU host's network.
# The panel's engines fetch none: the only domain allowed is one that cannot resolve (RFC 2606's .invalid), so a
# request sends media inline (data: URLs) or not at all; local files need --allowed-local-media-path, refused.
NO_MEDIA_DOMAINS = "--allowed-media-domains=media.invalid"
ENGINE_HAS_SWAP_SPACE = False  # vLLM 0.32: `--swap-space` is gone
MAX_TEXT_CHARS = 200_000
HEADER = "# config.toml —— vLLM 推理服务配置骨架"
BITS_COMMENTS = {4: "INT4，显存约降 75%", 8: "INT8 / FP8，显存约降 50%"}
# Profile field -> the vLLM flag that carries it. A bool field's negative form is --no-<flag>.
FIELD_FLAGS = {
    "served_model_name": "--served-model-name", "dtype": "--dtype", "quantization": "--quantization",
    "max_model_len": "--max-model-len", "block_size": "--block-size",
    "gpu_memory_utilization": "--gpu-memory-utilization", "swap_space": "--swap-space",
    "max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
    "enable_chunked_prefill": "--enable-chunked-prefill", "enable_prefix_caching": "--enable-prefix-caching",
    "tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
}
# Every spelling of a flag the profile owns, so extra_args cannot override it (vLLM lets the last one win).
OWNED_FLAGS = {flag: field for field, flag in FIELD_FLAGS.items()}
OWNED_FLAGS.update({"--model": "model", "--host": "host", "--port": "port", "--config": "the profile itself",
                    "--no-enable-chunked-prefill": "enable_chunked_prefill",
                    "--no-enable-prefix-caching": "enable_prefix_caching",
                    "--enable-auto-tool-choice": "tool_call_parser", "--tool-call-parser": "tool_call_parser",
                    "--enable-prompt-tokens-details": "the usage records (cached tokens)",
                    "--enable-lora": "the profile's LoRA settings", "--max-loras": "the profile's LoRA settings",
                    "--max-lora-rank": "the profile's LoRA settings",
                    "--no-enable-prompt-tokens-details": "the usage records (cached tokens)"})
SHORT_ALIASES = {"-q": "quantization", "-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size"}
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
NUMBER = re.compile(r"-\d")


class ConfigFileError(ValueError):
    """The file (or extra_args) is refused; `problems` lists each problem with its path, in words."""

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


# ---------------------------------------------------------------------------------------------- config.toml out

def toml_export(values):
    """The config.toml for a profile dict, in the usual layout with its comments."""
    lines = [HEADER]
    for section in SECTIONS:
        lines += ["", f"[{section}]"]
        for field in section_fields(section):
            value = values.get(field.name, field.default)
            if value is None:
                continue
            line = f"{field.key} = {_toml_value(value)}"
            comment = BITS_COMMENTS.get(value) if field.name == "quantization_bits" else field.comment
            lines.append(f"{line}  # {comment}" if comment else line)
    return "\n".join(lines) + "\n"


def _toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value, min_decimals=2)  # 0.90, as people write a utilization
    # JSON string escapes are TOML basic-string escapes; TOML also wants DEL escaped.
    return json.dumps(str(value), ensure_ascii=False).replace("\x7f", "\\u007f")


def _float_text(value, min_decimals=0):
    text = repr(float(value))
    if "." in text and "e" not in text:
        decimals = len(text.split(".")[1])
        text += "0" * max(0, min_decimals - decimals)
    return text


# ----------------------------------------------------------------------------------------------- config.toml in

def toml_import(text):
    """A profile dict (the config.toml fields only) from config.toml text (str or bytes). Raises ConfigFileError
    listing every problem with its TOML path; never any other exception."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ConfigFileError([f"not a text file: byte {error.start} is not UTF-8"]) from None
    if not isinstance(text, str):
        raise ConfigFileError([f"expected config.toml text, got {type(text).__name__}"])
    if len(text) > MAX_TEXT_CHARS:
        raise ConfigFileError([f"the file is {len(text):,} characters; a config.toml is at most "
                               f"{MAX_TEXT_CHARS:,}"])
    try:
        document = tomllib.loads(text.removeprefix("\ufeff"))
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError([f"not valid TOML: {error}"]) from None
    except ValueError:  # Python's limit on digits in a decimal number, raised from inside tomllib
        raise ConfigFileError(["not valid TOML: a number has too many digits"]) from None
    except RecursionError:
        raise ConfigFileError(["not valid TOML: values nested too deeply"]) from None
    problems, values = [], {}
    for key, value in document.items():
        if key not in SECTIONS:
            problems.append(_unknown_top_level(key, value))
        elif not isinstance(value, dict):
            problems.append(f"[{key}] must be a table (a [{key}] section), got {_show(value)}")
    for section in SECTIONS:
        table = document.get(section)
        _read_section(section, table if isinstance(table, dict) else {}, values, problems)
    if problems:
        raise ConfigFileError(problems)
    return values


def _read_section(section, table, values, problems):
    known = {field.key for field in section_fields(section)}
    for key in [key for key in table if key not in known]:
        hint = difflib.get_close_matches(key, known, n=1)
        problems.append(f"unknown key [{section}].{_show_key(key)}" + (
            f" (did you mean {hint[0]}?)" if hint else f"; known keys: {', '.join(sorted(known))}"))
    for field in section_fields(section):
        path = f"[{section}].{field.key}"
        if field.key not in table:
            if field.name == "model_name":
                problems.append(f"{path} is required: the hub id or path of the model to serve")
            values[field.name] = field.default
            continue
        values[field.name], problem = _checked(field, table[field.key], path)
        if problem:
            problems.append(problem)


def _unknown_top_level(key, value):
    known = ", ".join(f"[{name}]" for name in SECTIONS)
    if isinstance(value, dict):
        return f"unknown section [{_show_key(key)}]; config.toml has {known}"
    return f"unknown key {_show_key(key)} at the top level: keys belong in one of {known}"


def _checked(field, value, path):
    """(converted value, None) or (None, the problem in words)."""
    got = f", got {_show(value)}"
    if field.kind is bool:
        return (value, None) if isinstance(value, bool) else (None, f"{path} must be true or false{got}")
    if field.kind is float:
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        # vLLM requires 0 < utilization <= 1; the rules narrow this further.
        if number is None or not math.isfinite(number) or not field.min_value < number <= field.max_value:
            return None, f"{path} must be a number between {field.min_value:g} and {field.max_value:g}{got}"
        return float(number), None
    if field.kind is int:
        if field.choices:
            allowed = field.choice_values
            if isinstance(value, bool) or not isinstance(value, int) or value not in allowed:
                return None, f"{path} must be one of {', '.join(map(str, allowed))}{got}"
            return value, None
        if isinstance(value, bool) or not isinstance(value, int) or not \
                field.min_value <= value <= field.max_value:
            return None, f"{path} must be a whole number from {field.min_value:,} to {field.max_value:,}{got}"
        return value, None
    if not isinstance(value, str):
        return None, f"{path} must be a string{got}"
    if field.choices:
        if value not in field.choice_values:
            return None, f"{path} must be one of {', '.join(map(json.dumps, field.choice_values))}{got}"
        return value, None
    if not value.strip() or len(value) > 1000 or CONTROL_CHARS.search(value):
        return None, f"{path} must be a hub id or a path (1 to 1000 printable characters){got}"
    return value, None


def _show(value):
    """A value as a person would recognise it from the file."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = json.dumps(value if len(value) <= 60 else value[:57] + "...", ensure_ascii=False)
        return CONTROL_CHARS.sub("?", shown)
    if isinstance(value, int):
        if abs(value) < 10 ** 30:
            return str(value)
        # str() of an int past 4300 digits raises; a hex literal in TOML can be that long.
        return f"a {len(str(abs(value)))}-digit number" if value.bit_length() < 14_000 else "a huge number"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"the date/time {value.isoformat()}" if hasattr(value, "isoformat") else type(value).__name__


def _show_key(key):
    return key if re.fullmatch(r"[A-Za-z0-9_-]{1,60}", key) else _show(key)


# ------------------------------------------------------------------------------------------------- launching

def validate_extra_args(text, *, model_path=None, engine_flags=None):
    """extra_args as argv tokens, each flag with its value in one `--flag=value` token, or ConfigFileError: not
    shell-quoted, not a flag list, a flag the profile already sets (in any spelling vLLM accepts: underscores,
    `--flag=value`, prefixes, short aliases), a flag or value outside the allow-list (`engine_flags.py`; a file must
    be inside `model_path`), a value that starts with "-", or (given the host's `engine_flags`) a flag its vLLM
    does not know."""
    if not isinstance(text, str):
        raise ConfigFileError([f"extra_args must be text, got {type(text).__name__}"])
    try:
        tokens = shlex.split(text)
    except ValueError as error:
        raise ConfigFileError([f"extra_args is not a valid shell-quoted argument list: {error}"]) from None
    problems = []
    if tokens and not tokens[0].startswith("-"):
        problems.append(f"extra_args must be a list of flags starting with --, got {_show(tokens[0])} first "
                        "(a bare word would be taken as the model)")
    for token in tokens:
        if CONTROL_CHARS.search(token):
            problems.append(f"extra_args contains a control character in {_show(token)}")
        elif token == "--":
            problems.append("extra_args may not contain a bare --: what follows it would be taken as the model")
        elif (owner := _owned_by(token)) is not None:
            problems.append(f"extra_args sets {token.split('=', 1)[0]}, which the profile already sets "
                            f"({owner}): change it in the profile instead")
    arguments = []
    if not problems:
        arguments, problems = flag_tokens(tokens, model_path=model_path, engine_flags=engine_flags)
    if problems:
        raise ConfigFileError(problems)
    return arguments


def _owned_by(token):
    if token.startswith("--"):
        # vLLM rewrites underscores to dashes up to the first "." and reads --flag.key as a dict for --flag.
        name = "--" + token[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-")
        if len(name) > 2:
            for flag, owner in OWNED_FLAGS.items():
                if flag.startswith(name):  # argparse also accepts an unambiguous prefix
                    return owner
        return None
    if token.startswith("-") and not NUMBER.match(token):
        for alias, owner in SHORT_ALIASES.items():
            if token.startswith(alias):
                return owner
    return None


def _engine_options(values, *, model_path, port, host, checkpoint_quantized, swap_space_flag):
    """[(flag, value)] in launch order; a bool value stands for --flag / --no-flag."""
    def value(name):
        return values.get(name, FIELDS_BY_NAME[name].default)

    options = [("--model", str(model_path)),
               ("--served-model-name", value("served_model_name") or value("model_name")),
               ("--dtype", value("dtype"))]
    # An already-quantized checkpoint names its method in its own config; passing it again quantizes twice (vLLM
    # refuses or mis-loads it).
    if value("quantization") != "none" and not checkpoint_quantized:
        options.append(("--quantization", value("quantization")))
    options += [("--max-model-len", value("max_model_len")), ("--block-size", value("block_size")),
                ("--gpu-memory-utilization", float(value("gpu_memory_utilization")))]
    if swap_space_flag:
        options.append(("--swap-space", value("swap_space")))
    for name in ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
                 "tensor_parallel_size", "pipeline_parallel_size"):
        options.append((FIELD_FLAGS[name], value(name)))
    if value("tool_call_parser"):
        options += [("--enable-auto-tool-choice", True), ("--tool-call-parser", value("tool_call_parser"))]
    # Without it vLLM answers `prompt_tokens_details: null`, and no usage row could show its prefix-cache hits.
    options.append(("--enable-prompt-tokens-details", True))
    return options + [("--host", host), ("--port", int(port))]


def _option_argv(flag, value):
    """One token: `--flag`, `--no-flag` or `--flag=value` (a value never stands alone, where vLLM's parser could
    read it as an option of its own)."""
    if isinstance(value, bool):
        return [flag if value else "--no-" + flag[2:]]
    return [f"{flag}={_float_text(value) if isinstance(value, float) else value}"]


def launch_argv(values, *, model_path, port, engine_python="python", host="127.0.0.1", checkpoint_quantized=False,
                swap_space_flag=ENGINE_HAS_SWAP_SPACE, key_guard=False, host_args=(), engine_flags=None):
    """The vLLM OpenAI server command for a profile, as an argv list (the usual flags plus the ones we always set),
    ending with extra_args; every value in its flag's token. `key_guard`: the panel's own start: through the checked
    entry point (engine/serve.py), with the middleware that puts every path behind the engine's key (an exported
    command leaves both out: they import from Tokenwise's folder). `host_args`: flags the host's kind calls for,
    before extra_args (which may say otherwise: the last flag wins). `engine_flags`: the options the host's vLLM
    knows. Raises ConfigFileError when extra_args is refused."""
    extra = validate_extra_args(values.get("extra_args") or "", model_path=model_path, engine_flags=engine_flags)
    module = CHECKED_SERVER_MODULE if key_guard else SERVER_MODULE
    argv = [str(engine_python), "-m", module] + ([f"--middleware={KEY_GUARD}", NO_MEDIA_DOMAINS] if key_guard
                                                 else [])
    for flag, value in _engine_options(values, model_path=model_path, port=port, host=host,
                                       checkpoint_quantized=checkpoint_quantized, swap_space_flag=swap_space_flag):
        argv += _option_argv(flag, value)
    return argv + list(host_args) + extra


def _comment_text(text):
    return CONTROL_CHARS.sub(" ", str(text))  # a newline in a name must not end the comment line


def deploy_script(values, *, model_path, port, engine_python="python", host="127.0.0.1",
                  checkpoint_quantized=False, swap_space_flag=ENGINE_HAS_SWAP_SPACE):
    """The launch command as a readable vllm_deploy.sh: bash, strict mode, one flag per line, shell-quoted."""
    kwargs = dict(model_path=model_path, port=port, host=host, checkpoint_quantized=checkpoint_quantized,
                  swap_space_flag=swap_space_flag)
    extra = validate_extra_args(values.get("extra_args") or "", model_path=model_path)
    lines = [shlex.join(_option_argv(flag, value)) for flag, value in _engine_options(values, **kwargs)]
    lines += [shlex.quote(token) for token in extra]
    title = values.get("name") or values.get("model_name") or "serving profile"
    notes = [f"# vllm_deploy.sh —— {_comment_text(title)} (exported by Tokenwise)",
             "# The start-up log must show the quantization and prefix caching actually applied; ready when "
             f"GET http://{_comment_text(host)}:{int(port)}/v1/models answers.",
             "# The engine checks a key (VLLM_API_KEY): Tokenwise gives each start a new random one and tells only "
             "the deployment's local channel. By hand: export VLLM_API_KEY=<engine key>",
             "# vLLM's key guards only /v1: Tokenwise also adds --middleware " + KEY_GUARD + " (run from its "
             "project folder) so that /invocations, /tokenize, /metrics... need the key too."]
    if checkpoint_quantized and values.get("quantization", "none") != "none":
        notes.append("# No --quantization: the checkpoint is already quantized and vLLM reads the method from it "
                     "(passing it again would quantize twice).")
    if not swap_space_flag and values.get("swap_space"):
        notes.append(f"# swap_space = {int(values['swap_space'])} is not passed: this vLLM has no --swap-space.")
    body = f"exec {shlex.join([str(engine_python), '-m', SERVER_MODULE])} \\\n  " + " \\\n  ".join(lines)
    return "\n".join(["#!/usr/bin/env bash", *notes, "set -euo pipefail", "", body, ""])


def yaml_export(values, *, model_path, port, engine_python="python", host="127.0.0.1",
                checkpoint_quantized=False, swap_space_flag=ENGINE_HAS_SWAP_SPACE):
    """The same settings as a YAML file for `python -m vllm.entrypoints.openai.api_server --config FILE.yaml`.
    engine_python is accepted for a uniform signature; a YAML file does not name an interpreter."""
    options = _engine_options(values, model_path=model_path, port=port, host=host,
                              checkpoint_quantized=checkpoint_quantized, swap_space_flag=swap_space_flag)
    mapping = {flag[2:]: value for flag, value in options}
    leftovers = []
    for token in validate_extra_args(values.get("extra_args") or "", model_path=model_path):
        flag, has_value, word = token.partition("=")
        key = flag[2:]
        if key in mapping:
            leftovers.append(shlex.quote(token))
        else:
            mapping[key] = word if has_value else True
    header = ["# vLLM config file (exported by Tokenwise); vLLM wants the name to end in .yaml. Run:",
              f"# python -m {SERVER_MODULE} --config vllm_config.yaml"]
    if leftovers:
        header.append("# Not expressible here, add on the command line: " + _comment_text(" ".join(leftovers)))
    body = yaml.safe_dump(mapping, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return "\n".join(header) + "\n" + body
