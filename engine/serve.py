"""Starts vLLM's OpenAI server once vLLM's own parser has shown that the arguments mean what the panel wrote.

The panel builds every engine argument as one token (`--flag=value`) from a profile's checked fields and allowed
flags (panel/serving/configfile.py). vLLM's parser does more than argparse: it rewrites any token that starts with
`-` and holds a `.` into a dotted config option (`-cc.x=...` becomes `--compilation-config`), and argparse takes an
unknown `--flag= value` as a positional. So the panel's view of the string is not the last word: this entry point
parses the argv with the parser vLLM's server itself uses and refuses to start when vLLM would set any option that
no flag of the command names (a smuggled compilation config, say), when a flag is not one this vLLM knows, or when
a positional word appears. Then it runs vLLM's own `main` on the same argv.

    python -m engine.serve --model=/m --port=8001 ...          start the server (refused: exit 1, the reasons on
                                                               stderr and as the protocol's error line)
    python -m engine.serve --check-only --model=/m ...         print {"problems": [...], "set": {...}} and exit
    python -m engine.serve --help                              vLLM's own options

Runs inside the engine venv; imports nothing from the panel."""
import contextlib
import io
import json
import re
import sys

from engine.protocol import say

# Everything between the leading -- and the first ".": vLLM turns underscores into dashes there.
_NAME = re.compile(r"(?<=--)[^.]*")


def server_parser():
    """The parser vLLM's OpenAI server parses its command line with (its module moved between releases)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM before 0.32
        from vllm.entrypoints.openai.cli_args import make_arg_parser
    return make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))


def known_flags(parser=None):
    """Every option string this vLLM's server accepts (the engine check reports them to the panel)."""
    parser = parser or server_parser()
    return sorted(name for name in parser._option_string_actions if name.startswith("--"))


def _flag_name(token):
    return _NAME.sub(lambda match: match.group(0).replace("_", "-"), token.split("=", 1)[0], count=1)


def _parse(parser, argv):
    """(namespace, "") or (None, vLLM's own words for why it cannot parse argv)."""
    words = io.StringIO()
    try:
        with contextlib.redirect_stderr(words):
            return parser.parse_args(argv), ""
    except SystemExit:
        return None, " ".join(words.getvalue().split())[-600:] or "vLLM could not read the arguments"
    except Exception as error:  # a config class that refuses a value raises before argparse's own exit
        return None, f"{type(error).__name__}: {error}"[:600]


def check(argv, parser=None):
    """(problems in words, {option: value} for every option the arguments set) as vLLM reads `argv`."""
    parser = parser or server_parser()
    actions = parser._option_string_actions
    problems, named = [], set()
    for token in argv:
        if not token.startswith("--"):
            problems.append(f"{token[:80]!r} is not written as --flag or --flag=value: vLLM could read it as "
                            "another option or as the model")
            continue
        name = _flag_name(token)
        if "." in name or name not in actions:
            problems.append(f"{name[:80]} is not an option of this vLLM")
            continue
        named.add(actions[name].dest)
    if problems:
        return problems, {}
    parsed, why = _parse(parser, joined(argv, parser))
    if parsed is None:
        return [f"vLLM refuses the arguments: {why}"], {}
    defaults, _ = _parse(parser, [])
    changed = {dest: value for dest, value in vars(parsed).items()
               if defaults is None or getattr(defaults, dest, None) != value}
    for dest in sorted(set(changed) - named):
        problems.append(f"vLLM would set {dest} = {str(changed[dest])[:200]}, which no flag of the command names")
    return problems, {dest: _shown(value) for dest, value in changed.items()}


def joined(argv, parser):
    """`argv` with the tokens of a list option (`--lora-modules=a=/x`, `--lora-modules=b=/y`: one token each, as the
    panel writes every argument) joined into the one option argparse reads as a list (`--lora-modules a=/x b=/y`),
    where the first of them stood: given twice as `--flag=value`, argparse would keep only the last."""
    actions = parser._option_string_actions
    values, out = {}, []
    for token in argv:
        name = _flag_name(token)
        action = actions.get(name)
        if "=" in token and action is not None and action.nargs in ("+", "*"):
            if action.dest not in values:
                values[action.dest] = []
                out.append((name, values[action.dest]))
            values[action.dest].append(token.split("=", 1)[1])
        else:
            out.append(token)
    return [part for item in out for part in ((item,) if isinstance(item, str) else (item[0], *item[1]))]


def _shown(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    check_only = argv[:1] == ["--check-only"]
    argv = argv[1:] if check_only else argv
    parser = server_parser()
    if argv in (["--help"], ["-h"]):
        parser.print_help(sys.stdout)
        return 0
    problems, options = check(argv, parser)
    if check_only:
        say(problems=problems, set=options)
        return 0
    if problems:
        for problem in problems:
            print(f"tokenwise: the engine was not started: {problem}", file=sys.stderr, flush=True)
        say(error={"kind": "failed", "reason": "bad arguments: " + "; ".join(problems)})
        return 1
    try:
        from vllm.entrypoints.launchers.api_server.entry import main as serve
    except ImportError:  # vLLM before 0.32
        from vllm.entrypoints.openai.api_server import main as serve  # type: ignore[no-redef]
    sys.argv = [sys.argv[0], *joined(argv, parser)]
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
