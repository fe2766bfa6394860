"""deploy/ checked against the code it deploys: every file parses; every `PERFMODEL_*` variable it sets (or names) is a
field of the pydantic settings classes and reaches that field; every probe and health check asks a route of the
real app (and gets 200 from it); the Deployment runs 2 replicas, ready on /readyz and live on /healthz, scraped on
a port the container exposes; the ports are the Dockerfile's; the Secrets, volume claims and images referred to
exist; the retrain CronJob calls `perfmodel retrain` with options it has. The Grafana dashboard queries only metric
names that the running app exports at /metrics, and covers every metric it exports."""

from __future__ import annotations

import json
import os
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from perfmodel.settings import Settings
from service.settings import ServiceSettings, hash_token

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
PREFIX = "PERFMODEL_"


# --- reading deploy/ --------------------------------------------------------------------------------------------

def yaml_files() -> list[Path]:
    return sorted([*DEPLOY.glob("*.yaml"), *DEPLOY.glob("*.yml")])


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifests() -> list[dict[str, Any]]:
    """Every Kubernetes object of deploy/ (the documents with a kind, the kustomization left out)."""
    return [doc for path in yaml_files() for doc in documents(path)
            if "kind" in doc and doc["kind"] != "Kustomization"]


def objects(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in manifests() if doc["kind"] == kind]


def one(kind: str) -> dict[str, Any]:
    found = objects(kind)
    assert len(found) == 1, f"expected one {kind} in deploy/, found {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def containers(obj: dict[str, Any], *, init: bool = True) -> list[dict[str, Any]]:
    spec = pod_spec(obj)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def server() -> dict[str, Any]:
    """The Deployment's service container."""
    (container,) = containers(one("Deployment"), init=False)
    return container


def compose() -> dict[str, Any]:
    (doc,) = documents(DEPLOY / "compose.yaml")
    return doc


def compose_service() -> dict[str, Any]:
    """The compose service running the perfmodel image (the one built from the Dockerfile)."""
    (service,) = [s for s in compose()["services"].values() if "build" in s]
    return service


def compose_environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {name: str(value) for name, value in env.items()}


_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's variable interpolation: ${VAR}, $VAR, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, $$."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, argument = match.group(2), match.group(3) or ""
        present = environ.get(name)
        unset = present is None or (present == "" and operator in (":-", ":?"))
        if operator in (":?", "?") and unset:
            raise KeyError(f"compose needs {name}: {argument}")
        if operator in (":-", "-") and unset:
            return argument
        return present or ""

    return _INTERPOLATION.sub(substitute, value)


def dockerfile_port() -> int:
    """The port of the image's command (`perfmodel serve ... --port N`), which its EXPOSE must name too."""
    text = (ROOT / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD\s+(\[.*\])\s*$", text, re.M)
    argv = json.loads(cmd)
    assert argv[:2] == ["perfmodel", "serve"] and "--port" in argv
    port = int(argv[argv.index("--port") + 1])
    assert re.search(rf"^EXPOSE\s+{port}\b", text, re.M), "the Dockerfile exposes another port than it serves on"
    return port


# --- the settings the code has ------------------------------------------------------------------------------------

def _model_of(annotation: Any) -> type[BaseModel] | None:
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def setting_names() -> dict[str, tuple[str, ...]]:
    """Every environment variable the settings classes read -> its path of field names: `PERFMODEL_<FIELD>`, and
    `PERFMODEL_<FIELD>__<SUBFIELD>` for the fields of nested models where the class has a nested delimiter."""
    names: dict[str, tuple[str, ...]] = {}

    def walk(model: type[BaseModel], prefix: str, delimiter: str | None, path: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            alias = field.validation_alias if isinstance(field.validation_alias, str) else None
            env = (prefix + (alias or name)).upper()
            names[env] = (*path, name)
            nested = _model_of(field.annotation)
            if nested is not None and delimiter:
                walk(nested, env + delimiter, delimiter, (*path, name))

    for cls in (Settings, ServiceSettings):
        config = cls.model_config
        walk(cls, config.get("env_prefix", ""), config.get("env_nested_delimiter"), ())
    return names


def test_the_settings_classes_read_perfmodel_variables_nested_ones_included():
    names = setting_names()
    assert {"PERFMODEL_STORE_URL", "PERFMODEL_HOME", "PERFMODEL_TOKEN_SHA256", "PERFMODEL_MODELS_DIR"} <= set(names)
    assert names["PERFMODEL_JOB_LIMITS__MAX_LAYERS"] == ("job_limits", "max_layers")


# --- every file parses; every variable is a setting ---------------------------------------------------------------

def test_every_yaml_file_in_deploy_parses_and_the_kustomization_applies_every_manifest():
    files = {path.name for path in yaml_files()}
    assert {"kubernetes.yaml", "retrain-cronjob.yaml", "compose.yaml", "kustomization.yaml"} <= files
    for path in yaml_files():
        docs = documents(path)
        assert docs and all(isinstance(doc, dict) and doc for doc in docs), path
    (kustomization,) = documents(DEPLOY / "kustomization.yaml")
    with_manifests = {path.name for path in yaml_files()
                      if any("apiVersion" in doc and doc.get("kind") != "Kustomization" for doc in documents(path))}
    assert set(kustomization["resources"]) == with_manifests == {"kubernetes.yaml", "retrain-cronjob.yaml"}
    kinds = sorted(doc["kind"] for doc in manifests())
    assert {"Deployment", "Service", "Secret", "PersistentVolumeClaim", "CronJob"} <= set(kinds)
    images = {c["image"].split(":")[0] for obj in (one("Deployment"), one("CronJob")) for c in containers(obj)}
    assert {image["name"] for image in kustomization["images"]} == images == {"perfmodel"}


def set_variables() -> dict[str, list[str]]:
    """PERFMODEL_* variables set in deploy/: file -> names (Kubernetes env of every container, compose environment)."""
    found: dict[str, list[str]] = {}
    for obj in manifests():
        if obj["kind"] in ("Deployment", "CronJob", "StatefulSet", "Job", "DaemonSet"):
            for container in containers(obj):
                found.setdefault(f"{obj['kind']}/{container['name']}", []).extend(
                    e["name"] for e in container.get("env", []) if e["name"].startswith(PREFIX))
    for name, service in compose()["services"].items():
        found[f"compose/{name}"] = [v for v in compose_environment(service) if v.startswith(PREFIX)]
    return found


def test_every_perfmodel_variable_set_or_named_in_deploy_is_a_setting():
    valid = setting_names()
    found = set_variables()
    assert found["Deployment/perfmodel"] and found["CronJob/retrain"] and found["compose/perfmodel"]
    unknown = {where: sorted(set(names) - set(valid)) for where, names in found.items() if set(names) - set(valid)}
    assert not unknown, f"not settings of service/settings.py or perfmodel/settings.py: {unknown}"
    # comments and the README too: a variable named anywhere in deploy/ is one the code reads
    named = {word for path in DEPLOY.iterdir() if path.is_file()
             for word in re.findall(r"\bPERFMODEL_[A-Z0-9_]*[A-Z0-9]", path.read_text())}
    assert named and not named - set(valid), sorted(named - set(valid))


def _same(value: Any, raw: str) -> bool:
    if isinstance(value, bool):
        return value == (raw.strip().lower() in ("1", "true", "yes", "on"))
    if isinstance(value, (int, float)):
        return value == float(raw)
    if isinstance(value, tuple):
        return ",".join(value) == raw.lower()
    return str(value) == raw


def _settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ServiceSettings:
    for name in list(os.environ):
        if name.startswith(PREFIX):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return ServiceSettings()


def _assert_each_reaches_its_field(env: dict[str, str], settings: ServiceSettings) -> None:
    paths = setting_names()
    for name, raw in env.items():
        value: Any = settings
        for part in paths[name]:
            value = getattr(value, part)
        assert _same(value, raw), f"{name}={raw!r} gave {paths[name]} = {value!r}"


def secret_values() -> dict[tuple[str, str], str]:
    return {(secret["metadata"]["name"], key): value for secret in objects("Secret")
            for key, value in {**secret.get("data", {}), **secret.get("stringData", {})}.items()}


def test_the_deployment_environment_is_valid_settings_with_the_token_digest_from_a_secret(monkeypatch):
    secrets = secret_values()
    env: dict[str, str] = {}
    refs: dict[str, tuple[str, str]] = {}
    for item in server()["env"]:
        if "valueFrom" in item:
            ref = item["valueFrom"]["secretKeyRef"]
            refs[item["name"]] = (ref["name"], ref["key"])
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            env[item["name"]] = str(item["value"])
    # the token and the store URL come from Secrets, never in clear in the pod spec
    assert set(refs) == {"PERFMODEL_TOKEN_SHA256", "PERFMODEL_STORE_URL"}
    # the shipped placeholder is not a digest: the service refuses to start until it is replaced
    with pytest.raises(ValueError, match="SHA-256 hex digests"):
        _settings_from(env, monkeypatch)
    env["PERFMODEL_TOKEN_SHA256"] = hash_token("a token")
    settings = _settings_from(env, monkeypatch)
    _assert_each_reaches_its_field(env, settings)
    assert not settings.writes_open and settings.resolved_store_url().startswith("postgresql+psycopg://")
    # the image's command sets host and port: PERFMODEL_HOST / PERFMODEL_PORT would be overridden, so none is set
    assert "command" not in server() and "args" not in server()
    assert not {"PERFMODEL_HOST", "PERFMODEL_PORT"} & set(env)


def test_compose_sets_the_same_settings_on_a_healthy_postgres_and_needs_the_token(monkeypatch):
    from sqlalchemy.engine import make_url

    service = compose_service()
    raw = compose_environment(service)
    assert set(raw) == {item["name"] for item in server()["env"]}
    with pytest.raises(KeyError, match="PERFMODEL_TOKEN_SHA256"):  # no token, no start: writes never open by accident
        _ = {name: interpolate(value, {}) for name, value in raw.items()}
    shell = {"PERFMODEL_TOKEN_SHA256": hash_token("a token")}
    env = {name: interpolate(value, shell) for name, value in raw.items()}
    _assert_each_reaches_its_field(env, _settings_from(env, monkeypatch))

    # the store is the compose PostgreSQL service, with its user, password and database, once it is healthy
    services = compose()["services"]
    (db_name,) = [name for name, s in services.items() if str(s.get("image", "")).startswith("postgres:")]
    db = services[db_name]
    db_env = {name: interpolate(value, shell) for name, value in compose_environment(db).items()}
    url = make_url(env["PERFMODEL_STORE_URL"])
    assert (url.drivername, url.host, url.port) == ("postgresql+psycopg", db_name, 5432)
    assert (url.username, url.password, url.database) == (db_env["POSTGRES_USER"], db_env["POSTGRES_PASSWORD"],
                                                          db_env["POSTGRES_DB"])
    assert service["depends_on"][db_name]["condition"] == "service_healthy"
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    (volume,) = db["volumes"]
    assert volume.split(":")[0] in compose()["volumes"] and volume.endswith(":/var/lib/postgresql/data")
    assert [p.rsplit(":", 1)[-1] for p in service["ports"]] == [str(dockerfile_port())]
    assert "command" not in service


# --- probes: real routes of the app -------------------------------------------------------------------------------

@pytest.fixture
def app_settings(sqlite_url: str, tmp_path: Path) -> ServiceSettings:
    from tests.conftest import copy_shipped_models

    return ServiceSettings(store_url=sqlite_url, models_dir=copy_shipped_models(tmp_path / "models"),
                           sync_interval_s=0, capture_prestart=False)


def get_routes(settings: ServiceSettings) -> set[str]:
    """The paths the real app answers GET on (its OpenAPI schema: the routers' routes, as FastAPI includes them)."""
    from service.app import create_app

    paths = create_app(settings).openapi()["paths"]
    return {path for path, methods in paths.items() if "get" in methods}


def probe_paths() -> dict[str, str]:
    """Every HTTP probe path of deploy/: Kubernetes probes of every container, compose health-check URLs."""
    paths: dict[str, str] = {}
    for obj in manifests():
        if obj["kind"] in ("Deployment", "CronJob"):
            for container in containers(obj):
                for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                    if probe in container:
                        paths[f"{obj['kind']}/{container['name']}/{probe}"] = container[probe]["httpGet"]["path"]
    for name, service in compose()["services"].items():
        test = " ".join(service.get("healthcheck", {}).get("test", []))
        for i, url in enumerate(re.findall(r"https?://[^\s'\"]+", test)):
            assert url.startswith(f"http://127.0.0.1:{dockerfile_port()}/"), url
            paths[f"compose/{name}/healthcheck/{i}"] = "/" + url.split("/", 3)[3]
    return paths


def test_the_deployment_runs_two_replicas_ready_on_readyz_live_on_healthz_and_scraped_on_its_port(app_settings):
    deployment = one("Deployment")
    container = server()
    assert deployment["spec"]["replicas"] == 2
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p.get("name"): p["containerPort"] for p in container["ports"]}
    assert set(ports.values()) == {dockerfile_port()}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert (ports.get(port) if isinstance(port, str) else port) == dockerfile_port(), probe

    app_routes = get_routes(app_settings)
    paths = probe_paths()
    assert {"compose/perfmodel/healthcheck/0", "Deployment/perfmodel/readinessProbe"} <= set(paths)
    assert not {where: p for where, p in paths.items() if p not in app_routes}, paths

    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) in ports.values()
    assert annotations["prometheus.io/path"] == "/metrics" and "/metrics" in app_routes

    for each in containers(deployment):
        resources = each["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], each["name"]
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    # a graph capture's child process is held below the container's memory limit
    limit = container["resources"]["limits"]["memory"]
    limit_mib = int(limit[:-2]) * {"Mi": 1, "Gi": 1024}[limit[-2:]]
    env = {e["name"]: e.get("value") for e in container["env"]}
    capture_mib = int(env["PERFMODEL_JOB_LIMITS__MAX_CAPTURE_RSS_MB"])
    assert capture_mib < limit_mib


def test_the_service_secrets_volumes_and_labels_refer_to_what_is_defined():
    deployment, service, cronjob = one("Deployment"), one("Service"), one("CronJob")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert service["spec"]["selector"].items() <= pod_labels.items()
    for budget in objects("PodDisruptionBudget"):
        assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    names = {p["name"] for p in server()["ports"]} | {p["containerPort"] for p in server()["ports"]}
    assert all(p["targetPort"] in names for p in service["spec"]["ports"])

    secrets = secret_values()
    claims = {claim["metadata"]["name"] for claim in objects("PersistentVolumeClaim")}
    for obj in (deployment, cronjob):
        for container in containers(obj):
            for item in container.get("env", []):
                if "valueFrom" in item:
                    ref = item["valueFrom"]["secretKeyRef"]
                    assert (ref["name"], ref["key"]) in secrets, (obj["kind"], item["name"])
        volumes = {v["name"]: v for v in pod_spec(obj)["volumes"]}
        for container in containers(obj):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (obj["kind"], mount["name"])
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
    # the replicas and the retrain job share one registry: a claim every pod can mount
    (claim,) = objects("PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    models = {c["name"]: {e["name"]: e.get("value") for e in c.get("env", [])} for c in containers(cronjob)}
    assert models["retrain"]["PERFMODEL_MODELS_DIR"] == {e["name"]: e.get("value") for e in server()["env"]}[
        "PERFMODEL_MODELS_DIR"]
    # both run as the image's user, with the shared volume writable by it
    user = re.search(r"useradd .*--uid (\d+)", (ROOT / "Dockerfile").read_text())
    assert user is not None
    for obj in (deployment, cronjob):
        security = pod_spec(obj)["securityContext"]
        assert security["runAsUser"] == security["fsGroup"] == int(user.group(1))


def test_the_retrain_cronjob_calls_perfmodel_retrain_with_its_options_and_maps_kept_to_success():
    import typer.main

    from perfmodel.cli.app import app
    from perfmodel.evaluation.retrain import EXIT_KEPT

    (container,) = containers(one("CronJob"))
    script = " ".join(container["args"])
    assert "perfmodel retrain " in script
    command = typer.main.get_command(app)
    options = {opt for param in command.commands["retrain"].params for opt in param.opts}
    used = set(re.findall(r"\s(--[a-z][a-z-]*)", script.split("perfmodel retrain", 1)[1]))
    assert used and used <= options, used - options
    assert re.search(rf'"\$code" -eq {EXIT_KEPT} \]; then exit 0', script)
    assert one("CronJob")["spec"]["concurrencyPolicy"] == "Forbid"


# --- the Grafana dashboard ----------------------------------------------------------------------------------------

PROMQL_WORDS = {
    # aggregations, functions and keywords of PromQL: anything else in an expression is a metric name
    "sum", "avg", "min", "max", "count", "count_values", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "delta", "deriv",
    "exp", "floor", "histogram_quantile", "histogram_avg", "histogram_count", "histogram_sum", "histogram_fraction",
    "idelta", "increase", "irate", "label_join", "label_replace", "ln", "log2", "log10", "predict_linear", "rate",
    "resets", "round", "scalar", "sgn", "sort", "sort_desc", "sqrt", "time", "timestamp", "vector",
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time", "quantile_over_time",
    "stddev_over_time", "stdvar_over_time", "last_over_time", "present_over_time", "inf", "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, ranges, grouping labels, numbers, strings and
    Grafana's $variables taken out first)."""
    rest = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', " ", expr)
    rest = re.sub(r"\$\{[^}]*\}|\$\w+", " ", rest)
    rest = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", rest)
    rest = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", rest)
    rest = re.sub(r"(?<![\w:])\d+(?:\.\d+)?(?:[eE][+-]?\d+|(?:ms|[smhdwy])\b)?", " ", rest)  # numbers, durations
    return {word for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", rest) if word not in PROMQL_WORDS}


def test_metric_names_of_promql():
    expr = ('histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{instance=~"$x",s=~"5.."}[$__rate_interval])))'
            " / on (route) group_left sum without (le) (b_total offset 5m) > 1e3")
    assert metric_names(expr) == {"a_bucket", "b_total"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    return loaded


def panels(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for panel in items:
        out.append(panel)
        out.extend(panels(panel.get("panels", [])))
    return out


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: the panels' targets and the query variables' metric selectors."""
    exprs = [target["expr"] for panel in panels(dashboard()["panels"]) for target in panel.get("targets", [])]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            selector = re.fullmatch(r"label_values\((.+),\s*\w+\)", query.strip())
            exprs.append(selector.group(1) if selector else query)
    return exprs


def test_the_dashboard_is_grafana_json_on_a_prometheus_input():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41 and board["uid"] and board["title"]
    assert [i["name"] for i in board["__inputs"] if i["pluginId"] == "prometheus"] == ["DS_PROMETHEUS"]
    assert any(v["name"] == "DS_PROMETHEUS" and v["type"] == "datasource" for v in board["templating"]["list"])
    shown = [p for p in panels(board["panels"]) if p["type"] != "row"]
    assert len({p["id"] for p in panels(board["panels"])}) == len(panels(board["panels"]))
    for panel in shown:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        for source in (panel["datasource"], *(t["datasource"] for t in panel["targets"])):
            assert source == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    for expr in dashboard_queries():
        if "histogram_quantile" in expr:  # quantiles of the buckets, aggregated keeping `le`
            assert "_bucket" in expr and re.search(r"by \([^)]*\ble\b", expr), expr


def _tiny_ir() -> dict[str, Any]:
    """A one-node graph IR (a linear layer, batch 8), registered without a capture: the cheap way to a job."""
    from perfmodel.core.ir import Graph, GraphTotals, Node

    node = Node.model_validate({
        "id": "linear", "op": "aten.linear.default", "kind": "linear", "inputs": [],
        "input_tensors": [{"shape": [8, 13], "dtype": "float32"}, {"shape": [512, 13], "dtype": "float32"},
                          {"shape": [512], "dtype": "float32"}],
        "output_tensors": [{"shape": [8, 512], "dtype": "float32"}],
        "flops_fwd": 106496, "flops_bwd": 106496, "bytes_read_fwd": 29088, "bytes_written_fwd": 16384,
        "bytes_read_bwd": 45472, "bytes_written_bwd": 28672, "params": 7168})
    graph = Graph(name="deploy-test", source="torch.export", nodes=(node,), inputs=(node.input_tensors[0],),
                  totals=GraphTotals.from_nodes([node], params=7168, param_bytes=4 * 7168, activation_bytes=16384))
    loaded: dict[str, Any] = json.loads(graph.to_json())
    return loaded


def test_every_metric_of_the_dashboard_is_exported_by_the_running_app_and_every_export_is_shown(app_settings):
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from service.app import create_app

    with TestClient(create_app(app_settings), raise_server_exceptions=False) as client:
        for where, path in probe_paths().items():  # the probes answer 200 on a healthy server
            assert client.get(path).status_code == 200, where
        job = client.post("/v1/jobs", json={"source": {"kind": "ir", "graph": _tiny_ir()}, "batch_size": 8})
        assert job.status_code == 201, job.text
        t4 = {"job": job.json()["job_id"], "placement": {"accelerator": "t4"}}
        raw = client.post("/v1/predict", json=t4).json()
        observed = client.post("/v1/observations", json={**t4, "throughput_samples_per_s":
                                                         raw["throughput_samples_per_s"] * 0.8})
        assert observed.status_code == 201, observed.text
        assert client.post("/v1/predict", json=t4).json()["calibrated"] is True
        assert client.post("/v1/predict", json={**t4, "job": "no-such-job"}).status_code == 422
        exposition = client.get("/metrics")
    assert exposition.status_code == 200
    families = list(text_string_to_metric_families(exposition.text))
    samples = {sample.name for family in families for sample in family.samples}

    used = set().union(*(metric_names(expr) for expr in dashboard_queries()))
    assert used, "no metric in the dashboard"
    assert not used - samples, f"the dashboard queries metrics /metrics does not export: {sorted(used - samples)}"
    # the client's `<counter or histogram>_created` series (each child's creation time) are no metric of their own
    names = {family.name for family in families}
    exported = {name for name in names if name.startswith("perfmodel_")
                and not (name.endswith("_created") and name.removesuffix("_created") in names)}
    assert exported
    missing = {name for name in exported if not any(metric.startswith(name) for metric in used)}
    assert not missing, f"exported but on no panel: {sorted(missing)}"
    # the panels asked for: latency quantiles of the histogram, errors by status, the calibrated share
    exprs = dashboard_queries()
    assert any("histogram_quantile(0.5" in e for e in exprs) and any("histogram_quantile(0.99" in e for e in exprs)
    assert any("perfmodel_http_requests_total" in e and "status=~" in e for e in exprs)
    assert any(re.search(r"perfmodel_calibrated_predictions_total.*\)\s*/\s*sum.*perfmodel_predictions_total", e)
               for e in exprs)
