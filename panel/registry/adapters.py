"""LoRA adapters: registered on a base model after their files are checked against it ([0098]).

An adapter is PEFT's folder: adapter_config.json (peft_type LORA, r, lora_alpha, target_modules) and
adapter_model.safetensors. It comes from a folder under the model roots, or from a pip package installed in the
engine venv (`NAME` or `NAME==VERSION`: the folder inside it that holds adapter_config.json). Nothing is loaded:
the facts are read from the config and the safetensors header, and each adapted module is matched with the base's
weight of the same name, shapes and all. An adapter for another architecture names modules the base does not have,
or has them in other shapes; one for a model of another width shows it in its tensor shapes (the hidden size)."""
import re
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from panel.registry.inspection import CheckpointError, folder_size, read_json, safetensors_header
from panel.registry.models import EvaluationJob, LoraAdapter, ModelState
from panel.registry.services import folder_check, resolve_source

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# vLLM's --max-lora-rank takes one of these; an adapter's rank must fit the engine's.
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}")
PACKAGE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(==(?P<version>[A-Za-z0-9.+!_-]+))?")
# PEFT's tensor names: base_model.model.<the base's module>.lora_A.weight / lora_B.weight
LORA_TENSOR = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])(?:\.weight)?$")
# Modules whose input is the hidden state (lora_A's columns) and those whose output is (lora_B's rows).
READS_HIDDEN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "qkv_proj", "gate_up_proj")
WRITES_HIDDEN = ("o_proj", "down_proj")


@dataclass
class AdapterFacts:
    rank: int
    alpha: float | None
    target_modules: list
    hidden_size: int
    modules: dict = field(default_factory=dict)  # module name -> (in_features, out_features)


def rank_fits(rank):
    """The smallest --max-lora-rank vLLM takes that holds `rank`, or None above 512."""
    return next((allowed for allowed in VLLM_MAX_RANKS if allowed >= rank), None)


def read_adapter(folder):
    """AdapterFacts of the PEFT LoRA adapter in `folder`, or ValidationError saying what is wrong with it."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValidationError(f"{folder} does not exist")
    if not (folder / CONFIG).is_file():
        raise ValidationError(f"{folder} is not a LoRA adapter: it has no {CONFIG} (PEFT's save_pretrained "
                              "writes one)")
    if not (folder / WEIGHTS).is_file():
        raise ValidationError(f"{folder} has no {WEIGHTS}: Tokenwise reads adapters saved as safetensors")
    try:
        config = read_json(folder / CONFIG, CONFIG)
        header = safetensors_header(folder / WEIGHTS)
    except CheckpointError as error:
        raise ValidationError(str(error)) from None
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise ValidationError(f"{CONFIG} says peft_type {config.get('peft_type')!r}: only LoRA adapters are "
                              "served by vLLM")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ValidationError(f"{CONFIG} has no rank (r) as a whole number above 0")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValidationError(f"{CONFIG} gives some modules ranks of their own (rank_pattern): vLLM serves "
                              "adapters of one rank")
    alpha = config.get("lora_alpha")
    targets = config.get("target_modules") or []
    targets = sorted(targets) if isinstance(targets, list) else [str(targets)]
    modules = _modules(header, rank)
    hidden = _hidden_size(modules)
    return AdapterFacts(rank=rank, alpha=float(alpha) if isinstance(alpha, (int, float)) else None,
                        target_modules=targets, hidden_size=hidden, modules=modules)


def _modules(header, rank):
    parts = {}
    for name, spec in header.items():
        match = LORA_TENSOR.match(name)
        if match is None:
            raise ValidationError(f"{WEIGHTS} holds {name!r}, which is not a LoRA weight (lora_A / lora_B): "
                                  "vLLM serves LoRA adapters only")
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(n, int) for n in shape)):
            raise ValidationError(f"{WEIGHTS} has a corrupt entry for {name!r}")
        parts.setdefault(match["module"], {})[match["part"]] = shape
    if not parts:
        raise ValidationError(f"{WEIGHTS} holds no LoRA weights")
    modules = {}
    for module, found in sorted(parts.items()):
        if set(found) != {"A", "B"}:
            raise ValidationError(f"{WEIGHTS} has lora_A without lora_B (or the reverse) for {module}")
        (a_rank, in_features), (out_features, b_rank) = found["A"], found["B"]
        if a_rank != rank or b_rank != rank:
            raise ValidationError(f"{module} has rank {a_rank if a_rank != rank else b_rank} in {WEIGHTS}, and "
                                  f"{CONFIG} says r = {rank}")
        modules[module] = (in_features, out_features)
    return modules


def _hidden_size(modules):
    widths = {shape[0] for module, shape in modules.items() if module.rsplit(".", 1)[-1] in READS_HIDDEN}
    widths |= {shape[1] for module, shape in modules.items() if module.rsplit(".", 1)[-1] in WRITES_HIDDEN}
    if len(widths) > 1:
        raise ValidationError(f"{WEIGHTS} adapts modules of several hidden sizes ({', '.join(map(str, widths))})")
    if not widths:
        raise ValidationError(f"{WEIGHTS} adapts none of the attention or MLP projections ("
                              f"{', '.join(READS_HIDDEN + WRITES_HIDDEN)}): its hidden size cannot be read")
    return widths.pop()


def base_problems(facts, base):
    """Why the adapter cannot run on `base` (a RegisteredModel), in words; [] when it fits."""
    problems = []
    if facts.hidden_size != base.hidden_size:
        problems.append(f"it was trained for a model of hidden size {facts.hidden_size}, and {base.name} "
                        f"({base.model_type}) has {base.hidden_size}")
    try:
        weights = {}
        for path in sorted(Path(base.path).glob("*.safetensors")):
            weights.update(safetensors_header(path))
    except CheckpointError as error:
        return problems + [f"{base.name}'s weights cannot be read ({error})"]
    missing, other = [], []
    for module, (in_features, out_features) in facts.modules.items():
        spec = weights.get(f"{module}.weight")
        if spec is None:
            missing.append(module)
        elif not base.is_quantized and list(spec.get("shape") or []) != [out_features, in_features]:
            other.append(f"{module} ({out_features}×{in_features}, the base's {spec.get('shape')})")
    if missing:
        problems.append(f"it adapts {len(missing)} module(s) {base.name} does not have, such as {missing[0]}: "
                        f"it was made for another architecture than {base.architecture}")
    if other and not problems:
        problems.append(f"{len(other)} module(s) have other shapes in {base.name}, such as {other[0]}: it was "
                        f"made for another architecture than {base.architecture}")
    return problems


def adapter_source(source, *, team):
    """The folder of what the user typed: an absolute path under the model roots, or a pip package installed in the
    engine venv (NAME or NAME==VERSION)."""
    source = (source or "").strip()
    if not source:
        raise ValidationError("Give the adapter's folder (an absolute path) or its pip package (NAME==VERSION).")
    if source.startswith(("/", "~")):
        folder, _ = resolve_source(source)
        folder_check(folder, team=team)
        return folder
    match = PACKAGE.fullmatch(source)
    if match is None:
        raise ValidationError(f"{source!r} is neither an absolute path nor a pip package name (NAME==VERSION).")
    return package_folder(match["name"], match["version"])


def site_packages():
    """The engine venv's site-packages folders (where its pip installs packages)."""
    prefix = Path(str(settings.ENGINE_PYTHON)).parent.parent
    return sorted(prefix.glob("lib/python3*/site-packages"))


def package_folder(name, version=None):
    """The folder holding adapter_config.json inside the pip package `name` installed in the engine venv."""
    wanted = re.sub(r"[-_.]+", "_", name).lower()
    for packages in site_packages():
        for info in packages.glob("*.dist-info"):
            dist, _, dist_version = info.name.removesuffix(".dist-info").partition("-")
            if re.sub(r"[-_.]+", "_", dist).lower() != wanted:
                continue
            if version and dist_version != version:
                raise ValidationError(f"the engine venv has {name} {dist_version}, not {version}: install "
                                      f"{name}=={version} there (pip) first")
            record = info / "RECORD"
            lines = record.read_text(errors="replace").splitlines() if record.is_file() else []
            configs = sorted(line.split(",", 1)[0] for line in lines
                             if line.split(",", 1)[0].endswith("/" + CONFIG) or line.startswith(CONFIG + ","))
            if not configs:
                raise ValidationError(f"the pip package {name} holds no {CONFIG}: it is not a LoRA adapter")
            if len(configs) > 1:
                raise ValidationError(f"the pip package {name} holds {len(configs)} adapters "
                                      f"({', '.join(configs[:3])}): register the one you mean by its folder")
            folder = (packages / configs[0]).parent.resolve()
            if packages.resolve() not in folder.parents:
                raise ValidationError(f"the pip package {name} names an adapter outside its own files")
            return folder
    raise ValidationError(f"no pip package {name} is installed in the engine venv: install it there (pip) first")


def adapter_register(*, team, user, base, source, name="", served_name=""):
    """Check the adapter at `source` against `base` and register it. Raises ValidationError (every problem in
    words), saving nothing."""
    if base.team_id != team.pk:
        raise ValidationError("No such base model.")
    if base.state != ModelState.READY:
        raise ValidationError(f"{base.name} failed its check as a model: adapters cannot be served on it")
    folder = adapter_source(source, team=team)
    facts = read_adapter(folder)
    problems = base_problems(facts, base)
    if problems:
        raise ValidationError(f"This adapter does not fit {base.name}: " + "; ".join(problems) + ".")
    if rank_fits(facts.rank) is None:
        raise ValidationError(f"rank {facts.rank} is above vLLM's largest, {VLLM_MAX_RANKS[-1]}")
    name = (name or "").strip() or folder.name
    served_name = (served_name or "").strip() or name
    if not SERVED_NAME.fullmatch(served_name):
        raise ValidationError(f"{served_name!r} cannot be a served name: letters, digits and . _ : / - only, "
                              "starting with a letter or digit")
    if base.serving_profiles.filter(served_model_name=served_name).exists() or served_name == base.name:
        raise ValidationError(f"{served_name!r} is the served name of the base model itself: pick another one")
    try:
        with transaction.atomic():
            return LoraAdapter.objects.create(
                team=team, base=base, name=name[:200], served_name=served_name, path=str(folder),
                source=source.strip()[:300], rank=facts.rank, alpha=facts.alpha, target_modules=facts.target_modules,
                hidden_size=facts.hidden_size, size_bytes=folder_size(folder), created_by=user)
    except IntegrityError:
        raise ValidationError(f"This team already has an adapter named {name!r} or served as {served_name!r}; "
                              "pick another name.") from None


def adapter_delete(*, adapter):
    """Remove the registration and its quality reports (the files stay). Refused while a serving profile loads it at
    start, an engine serves it or a report measures it."""
    profiles = list(adapter.serving_profiles.values_list("name", flat=True))
    if profiles:
        which = (f"the serving profile {profiles[0]}" if len(profiles) == 1
                 else f"the serving profiles {', '.join(profiles)}")
        raise ValidationError(f"{adapter.name} is loaded at start by {which}: take it out first.")
    running = list(adapter.deployments.values_list("deployment_id", flat=True))
    if running:
        raise ValidationError(f"{adapter.name} is loaded on deployment #{running[0]}: unload it there first.")
    report = adapter.evaluation_jobs.filter(state__in=EvaluationJob.ACTIVE_STATES).first()
    if report is not None:
        raise ValidationError(f"{adapter.name} is being measured (quality report #{report.pk}): wait for it to end "
                              "or cancel it first.")
    adapter.delete()


def adapter_audit_name(adapter):
    """How an adapter's registration and removal are named in the audit log, from the pages and the API alike."""
    return f"adapter {adapter.served_name} of {adapter.base.name}"


def adapters_of(model):
    """The adapters a deployment of `model` may serve: those registered on it, or on the model it was quantized
    from (an adapter trained on the full-precision weights runs on a quantized copy)."""
    return LoraAdapter.objects.filter(team=model.team_id, base__in=model.adapter_bases).order_by("name")
