"""The Helm chart (deploy/helm/tokenwise) rendered by the real helm (`make helm`), every object checked against the
Kubernetes JSON schemas offline (kubernetes-validate), and what the schemas cannot know: GPU pools request their
GPUs and select their nodes, every variable a container gets is one the panel reads, the Service reaches the web
port, no secret is written into the objects, and bad values stop the render with the chart's own message."""
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from panel.env import envbindings, names_read

BASE = Path(__file__).resolve().parents[2]
CHART = BASE / "deploy" / "helm" / "tokenwise"
TWO_POOLS = BASE / "deploy" / "helm" / "two-gpu-pools.values.yaml"
HELM_VERSION = "4.1.4"  # the Makefile's HELM_VERSION
HELM = BASE / ".node" / f"helm-{HELM_VERSION}" / "helm"
# The version helm renders for; the schemas checked are the oldest the chart admits (Chart.yaml) and the newest shipped.
KUBERNETES_VERSION = "1.33.0"
SCHEMA_VERSIONS = ("1.27.0", kubernetes_validate.latest_version())
SECRET_NAMES = {"SECRET_KEY", "TOKENWISE_ENCRYPTION_KEYS", "TOKENWISE_METRICS_TOKEN", "DATABASE_URL"}


def helm(*arguments):
    assert HELM.exists(), f"{HELM} is missing: `make helm` installs it"
    return subprocess.run([str(HELM), *arguments], capture_output=True, text=True, timeout=60)


def render(*values_files, sets=()):
    arguments = ["template", "tw", str(CHART), "--kube-version", KUBERNETES_VERSION]
    for values in values_files:
        arguments += ["-f", str(values)]
    for assignment in sets:
        arguments += ["--set", assignment]
    done = helm(*arguments)
    assert done.returncode == 0, done.stderr
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def by_kind(objects, kind):
    return {item["metadata"]["name"]: item for item in objects if item["kind"] == kind}


def pod_specs(objects):
    for item in objects:
        if item["kind"] in ("Deployment", "Job"):
            yield item["metadata"]["name"], item["spec"]["template"]["spec"]


def containers(objects):
    for name, spec in pod_specs(objects):
        for container in spec.get("initContainers", []) + spec["containers"]:
            yield name, container


def env_of(container):
    return {variable["name"]: variable for variable in container.get("env", [])}


def gpu_deployments(objects):
    return {name: item for name, item in by_kind(objects, "Deployment").items()
            if item["metadata"]["labels"]["app.kubernetes.io/component"] == "gpu-worker"}


@pytest.fixture(scope="module")
def default_objects():
    return render()


@pytest.fixture(scope="module")
def two_pool_objects():
    return render(TWO_POOLS)


@pytest.fixture(scope="module")
def panel_names():
    """Every variable the panel reads for its configuration: the settings module's (imported by the test run), the
    web server's and the workers' (read when they start), and PROMETHEUS_MULTIPROC_DIR (panel/web.py)."""
    import os

    from panel import web
    from workers.start import argv_for

    saved = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(BASE / "data" / "test-helm-prometheus")
    try:
        web.command([])
        for kind in ("default", "long", "gpu", "beat"):
            argv_for(kind)
    finally:
        if saved is None:
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR")
        else:
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = saved
    return names_read() | {"PROMETHEUS_MULTIPROC_DIR"}


def test_it_runs_the_pinned_helm():
    done = helm("version", "--short")
    assert done.stdout.startswith(f"v{HELM_VERSION}+"), done.stdout


@pytest.mark.parametrize("values", [(), (TWO_POOLS,)], ids=["default values", "two GPU pools"])
def test_it_renders_objects_the_kubernetes_schemas_accept(values):
    objects = render(*values)
    kinds = sorted(item["kind"] for item in objects)
    assert kinds.count("Deployment") >= 5 and {"Service", "Job", "PersistentVolumeClaim"} <= set(kinds)
    for item in objects:
        for version in SCHEMA_VERSIONS:
            # strict: a field Kubernetes does not know (a typo, a wrong level) fails too
            kubernetes_validate.validate(item, version, strict=True)


def test_it_rejects_what_the_schemas_reject():
    # The validation the suite relies on does fail: a Deployment without its selector, a port given as words.
    objects = render()
    web = by_kind(objects, "Deployment")["tw-tokenwise-web"]
    broken = yaml.safe_load(yaml.safe_dump(web))
    del broken["spec"]["selector"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(web))
    broken["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_it_runs_every_component_compose_runs(default_objects):
    commands = {name: container.get("command") for name, container in containers(default_objects)}
    assert commands["tw-tokenwise-default-worker"] == ["python", "-m", "workers.start", "default"]
    assert commands["tw-tokenwise-long-worker"] == ["python", "-m", "workers.start", "long"]
    assert commands["tw-tokenwise-beat"] == ["python", "-m", "workers.start", "beat"]
    assert commands["tw-tokenwise-gpu-gpu"] == ["python", "-m", "workers.start", "gpu"]
    assert commands["tw-tokenwise-migrate"] == ["python", "manage.py", "migrate", "--noinput"]
    assert "exec python -m panel.web" in commands["tw-tokenwise-web"][-1]
    deployments = by_kind(default_objects, "Deployment")
    assert deployments["tw-tokenwise-beat"]["spec"]["replicas"] == 1
    assert deployments["tw-tokenwise-beat"]["spec"]["strategy"]["type"] == "Recreate"
    job = by_kind(default_objects, "Job")["tw-tokenwise-migrate"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["spec"]["activeDeadlineSeconds"] == 600


def test_it_gives_each_gpu_pool_a_deployment_on_its_nodes(two_pool_objects):
    pools = yaml.safe_load(TWO_POOLS.read_text())["gpuPools"]
    deployments = gpu_deployments(two_pool_objects)
    assert sorted(deployments) == ["tw-tokenwise-gpu-h100", "tw-tokenwise-gpu-l4"]
    for pool in pools:
        deployment = deployments[f"tw-tokenwise-gpu-{pool['name']}"]
        spec = deployment["spec"]["template"]["spec"]
        assert deployment["spec"]["replicas"] == pool["replicas"]
        assert spec["nodeSelector"] == pool["nodeSelector"]
        container = spec["containers"][0]
        assert container["image"] == "registry.example.com/tokenwise/gpu-worker:0.1.0"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == pool["gpus"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == pool["gpus"]
        env = env_of(container)
        assert env["TOKENWISE_GPU_CONCURRENCY"]["value"] == str(pool["concurrency"])
        # the worker's queue is gpu.<node>, and the gateway reaches its engines at the pod's address
        assert env["TOKENWISE_HOST_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["TOKENWISE_ENGINE_ADVERTISE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert env["TOKENWISE_ENGINE_BIND"]["value"] == "0.0.0.0"
        # one worker to a node: two workers on a node would both call themselves gpu.<node>
        anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert anti["topologyKey"] == "kubernetes.io/hostname"
        assert anti["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gpu-worker"
        shm = next(volume for volume in spec["volumes"] if volume["name"] == "shm")
        assert shm["emptyDir"]["medium"] == "Memory"
    l4 = deployments["tw-tokenwise-gpu-l4"]["spec"]["template"]["spec"]
    assert {"key": "cloud.google.com/gke-spot", "operator": "Exists", "effect": "NoSchedule"} in l4["tolerations"]
    h100 = deployments["tw-tokenwise-gpu-h100"]["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert h100["requests"]["memory"] == "128Gi" and h100["limits"]["memory"] == "256Gi"


def test_it_sets_only_variables_the_panel_reads(default_objects, two_pool_objects, panel_names):
    bound = yaml.safe_load(TWO_POOLS.read_text())["config"]["TOKENWISE_CREDENTIAL_ENV_BINDINGS"]
    import os

    os.environ["TW_TEST_BINDINGS"] = bound
    try:
        upstream_keys = set(envbindings("TW_TEST_BINDINGS", ""))
    finally:
        del os.environ["TW_TEST_BINDINGS"]
    assert upstream_keys == {"TAOTOKEN_API_KEY", "TOKENWISE_UPSTREAM_OPENAI"}
    for objects, allowed in ((default_objects, panel_names), (two_pool_objects, panel_names | upstream_keys)):
        for owner, container in containers(objects):
            names = [variable["name"] for variable in container["env"]]
            assert len(names) == len(set(names)), f"{owner}: a variable is set twice: {names}"
            unknown = set(names) - allowed
            assert not unknown, f"{owner} sets variables the panel never reads: {sorted(unknown)}"


def test_it_reads_secrets_only_from_secrets(two_pool_objects):
    rendered = yaml.safe_dump_all(two_pool_objects)
    assert "kind: Secret\n" not in rendered
    for owner, container in containers(two_pool_objects):
        env = env_of(container)
        for name in SECRET_NAMES:
            assert "value" not in env[name], f"{owner}: {name} is written into the object"
        assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "tokenwise-db-app", "key": "uri"}
        assert env["SECRET_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tokenwise-secrets", "key": "secret-key"}
        assert env["REDIS_URL"] == {"name": "REDIS_URL", "value": "redis://redis-master.data.svc.cluster.local:6379/0"}
        assert env["TAOTOKEN_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "upstream-keys", "key": "taotoken"}


def test_it_serves_the_web_service_on_the_web_port(two_pool_objects):
    service = by_kind(two_pool_objects, "Service")["tw-tokenwise-web"]
    web = by_kind(two_pool_objects, "Deployment")["tw-tokenwise-web"]
    pod = web["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    (service_port,) = service["spec"]["ports"]
    (container_port,) = [port for port in container["ports"] if port["name"] == service_port["targetPort"]]
    listens = int(re.search(r"--port (\d+)", container["command"][-1]).group(1))
    assert container_port["containerPort"] == listens == 8000
    assert container["readinessProbe"]["httpGet"]["port"] == service_port["targetPort"]
    ingress = by_kind(two_pool_objects, "Ingress")["tw-tokenwise"]
    backend = ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": "tw-tokenwise-web", "port": {"name": "http"}}
    assert ingress["spec"]["tls"] == [{"hosts": ["tokenwise.example.com"], "secretName": "tokenwise-tls"}]
    # each pod adds up its own processes' counters: the folder is the pod's, never the shared volume
    multiproc = env_of(container)["PROMETHEUS_MULTIPROC_DIR"]["value"]
    local = next(mount for mount in container["volumeMounts"] if mount["name"] == "local")
    assert multiproc.startswith(local["mountPath"] + "/")
    assert {"name": "local", "emptyDir": {}} in pod["spec"]["volumes"]


def test_it_mounts_one_data_volume_everywhere_and_selects_its_own_pods(two_pool_objects):
    claims = by_kind(two_pool_objects, "PersistentVolumeClaim")
    assert list(claims) == ["tw-tokenwise-data"]
    assert claims["tw-tokenwise-data"]["spec"]["accessModes"] == ["ReadWriteMany"]
    for name, deployment in by_kind(two_pool_objects, "Deployment").items():
        template = deployment["spec"]["template"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items(), name
        (data,) = [volume for volume in template["spec"]["volumes"] if volume["name"] == "data"]
        assert data["persistentVolumeClaim"]["claimName"] == "tw-tokenwise-data", name
        assert template["spec"]["imagePullSecrets"] == [{"name": "registry-example-com"}], name
    selectors = [tuple(sorted(item["spec"]["selector"]["matchLabels"].items()))
                 for item in by_kind(two_pool_objects, "Deployment").values()]
    assert len(selectors) == len(set(selectors)), "two Deployments select the same pods"


POOL = {"name": "gpu", "nodeSelector": {"pool": "a"}, "gpus": 1}


@pytest.mark.parametrize("values, message", [
    ({"config": {"SECRET_KEY": "plain"}}, "config.SECRET_KEY: the chart sets SECRET_KEY itself"),
    ({"gpuPools": [{**POOL, "nodeSelector": {}}]},
     "gpuPools[0].nodeSelector: give the labels that select the pool's nodes"),
    ({"gpuPools": [{**POOL, "gpus": 0}]}, "gpuPools[0].gpus: the number of GPUs each worker requests (1 or more)"),
    ({"gpuPools": [{**POOL, "gpus": "all"}]}, "gpuPools[0].gpus: the number of GPUs each worker requests"),
    ({"gpuPools": [{**POOL, "name": "GPU_Pool"}]}, 'gpuPools[0].name "GPU_Pool": use up to 20 lower case letters'),
    ({"gpuPools": [POOL, {**POOL, "nodeSelector": {"pool": "b"}}]},
     'gpuPools[1].name "gpu": two GPU pools have this name'),
    ({"postgresql": {"urlSecret": {"name": ""}}}, "postgresql.urlSecret: name the Secret that holds it"),
])
def test_it_refuses_bad_values_with_its_own_message(values, message, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(values))
    done = helm("template", "tw", str(CHART), "-f", str(bad))
    assert done.returncode != 0
    assert message in done.stderr
    assert done.stdout == ""
