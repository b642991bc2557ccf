"""Checks of the rendered deprov manifests that a schema cannot express; run by deploy/check.sh.

    check_manifests.py split OUTDIR FILE...   one file per document: OUTDIR/NN-Kind-name.yaml
    check_manifests.py check --alerts ALERTS --toml TOML FILE...
    check_manifests.py run-spec --base DIR --secrets JSON [--set NAME=VALUE]... KIND/NAME

`check` reads every document of the FILEs (the output of `kubectl kustomize`, or the resource files
themselves, when the checks that need kustomize's generated ConfigMaps are skipped) and checks what ties them
together: commands and flags, ports against DEPROV_LISTEN / DEPROV_METRICS_LISTEN, probes, the
security context, resources, secrets by reference only, the migration Job's session-mode URL, the
worker's grace period against [worker] lease, the PodMonitor's selector and job label against the
alerts' job="...", the PodDisruptionBudgets' and NetworkPolicies' selectors, and the
PrometheusRule's groups against deploy/monitoring/alerts.yaml. Prints one line per check; exits 1
when any fails.

`run-spec` prints how the base runs the container of one workload (deploy/rehearse.sh runs it so):
`ARG <word>` lines (command, then args) and `ENV NAME=VALUE` lines (the configMapGenerator literals
of its envFrom, then its env). A secretKeyRef takes its value from the JSON object SECRETS
({"secret-name/key": value}); `--set` replaces the value of a variable the workload sets (an address
or a file path of the machine it runs on). Exits 1 when a secret is missing from SECRETS, or
`--set` names a variable the workload does not set.
"""

import argparse
import json
import pathlib
import re
import sys
import tomllib

import yaml

SECRET_NAME = re.compile(r"(URL|TOKEN|SECRET|PASSWORD|KEY)$")
API = ("Deployment", "deprov-api")
WORKER = ("Deployment", "deprov-worker")
MIGRATE = ("Job", "deprov-migrate")
EXPECTED = [
    ("ServiceAccount", "deprov"),
    API,
    WORKER,
    MIGRATE,
    ("Service", "deprov"),
    ("PodDisruptionBudget", "deprov-api"),
    ("PodDisruptionBudget", "deprov-worker"),
    ("NetworkPolicy", "deprov-default"),
    ("PodMonitor", "deprov"),
    ("PrometheusRule", "deprov"),
]
API_VERSIONS = {"PodMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1"}


class Report:
    def __init__(self):
        self.failures = 0

    def check(self, ok, message, detail=""):
        if ok:
            print(f"ok   {message}")
        else:
            self.failures += 1
            print(f"FAIL {message}{': ' + detail if detail else ''}", file=sys.stderr)
        return ok

    def skip(self, message):
        print(f"skip {message}")


def load(paths):
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            docs.extend((path, d) for d in yaml.safe_load_all(f) if d is not None)
    return docs


def split(outdir, paths):
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    for n, (_, doc) in enumerate(load(paths)):
        name = doc.get("metadata", {}).get("name", "unnamed")
        target = out / f"{n:02d}-{doc.get('kind', 'Unknown')}-{name}.yaml"
        with open(target, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f, sort_keys=False)
        print(target)


def selects(selector, labels):
    """Whether a LabelSelector (matchLabels, matchExpressions) selects these labels."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def duration_seconds(text):
    """A humantime duration ("30s", "1m 30s", "500ms") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    total, rest = 0.0, text.replace(" ", "")
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", rest):
        total += float(number) * units[unit]
    if not re.fullmatch(r"((\d+(\.\d+)?)(ms|s|m|h))+", rest):
        raise ValueError(f"not a duration: {text!r}")
    return total


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def pod_spec(doc):
    return doc["spec"]["template"]["spec"]


def pod_labels(doc):
    return doc["spec"]["template"]["metadata"].get("labels", {})


def container(doc):
    return pod_spec(doc)["containers"][0]


def named_ports(doc):
    return {p["name"]: p["containerPort"] for c in pod_spec(doc)["containers"] for p in c.get("ports", [])}


def env_refs(c):
    """{name: ("value", v) | ("secret", name, key) | ("other", ...)} of a container's env."""
    out = {}
    for e in c.get("env", []):
        if "value" in e:
            out[e["name"]] = ("value", e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            out[e["name"]] = ("secret", ref["name"], ref["key"])
        else:
            out[e["name"]] = ("other",)
    return out


def effective_env(c, configmaps):
    """Literal env values: envFrom ConfigMaps first, then env (which wins). None if unresolvable."""
    values = {}
    for source in c.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            continue
        if ref["name"] not in configmaps:
            return None
        values.update(configmaps[ref["name"]].get("data", {}))
    for name, ref in env_refs(c).items():
        values[name] = ref[1] if ref[0] == "value" else ref
    return values


def probe_path_port(probe):
    get = (probe or {}).get("httpGet") or {}
    return get.get("path"), get.get("port")


def falsy(value):
    return str(value).strip().lower() in ("false", "0", "no", "off")


def run_checks(args):
    report = Report()
    docs = load(args.files)
    index = {(d.get("kind"), d.get("metadata", {}).get("name")): d for _, d in docs}
    configmaps = {d["metadata"]["name"]: d for _, d in docs if d.get("kind") == "ConfigMap"}

    print("== objects")
    incomplete = [
        f"{path}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
        for path, d in docs
        if not (d.get("apiVersion") and d.get("kind") and d.get("metadata", {}).get("name"))
    ]
    report.check(not incomplete, f"{len(docs)} objects have apiVersion, kind and metadata.name", ", ".join(incomplete))
    missing = [f"{kind}/{name}" for kind, name in EXPECTED if (kind, name) not in index]
    report.check(not missing, f"{len(EXPECTED)} expected objects present", "missing " + ", ".join(missing))
    for kind, version in API_VERSIONS.items():
        for d in (d for _, d in docs if d.get("kind") == kind):
            report.check(d["apiVersion"] == version, f"{kind}/{d['metadata']['name']}: apiVersion {version}")
    secrets = [d["metadata"]["name"] for _, d in docs if d.get("kind") == "Secret"]
    report.check(not secrets, "no Secret object committed (Secrets are referenced by name only)", ", ".join(secrets))
    if any(k not in index for k in (API, WORKER, MIGRATE)):
        return report.failures
    api, worker, job = index[API], index[WORKER], index[MIGRATE]
    workloads = {"deprov-api": api, "deprov-worker": worker, "deprov-migrate": job}

    print("== pods: security context, resources, secrets by reference")
    for name, doc in workloads.items():
        spec = pod_spec(doc)
        pod_sc = spec.get("securityContext", {})
        report.check(spec.get("automountServiceAccountToken") is False, f"{name}: no service account token mounted")
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext", {})
            where = f"{name}/{c['name']}"
            report.check(
                sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True
                and sc.get("runAsUser", pod_sc.get("runAsUser", 1)) != 0,
                f"{where}: runAsNonRoot",
            )
            report.check(sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem")
            report.check(sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation false")
            report.check("ALL" in (sc.get("capabilities", {}).get("drop") or []), f"{where}: capabilities drop ALL")
            report.check(
                not (sc.get("capabilities", {}).get("add") or []) and not sc.get("privileged", False),
                f"{where}: no capability added, not privileged",
            )
            seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {}))
            report.check(seccomp.get("type") == "RuntimeDefault", f"{where}: seccompProfile RuntimeDefault")
            res = c.get("resources", {})
            report.check(
                all(k in res.get(part, {}) for part in ("requests", "limits") for k in ("cpu", "memory")),
                f"{where}: cpu and memory requests and limits",
            )
            for var, ref in env_refs(c).items():
                if SECRET_NAME.search(var):
                    report.check(ref[0] == "secret", f"{where}: {var} from a secretKeyRef", f"got {ref[0]}")

    print("== deprov serve --no-worker")
    c = container(api)
    api_ports = named_ports(api)
    report.check(
        c.get("command", []) + c.get("args", []) == ["deprov", "serve", "--no-worker"],
        "deprov-api runs `deprov serve --no-worker`",
        " ".join(c.get("command", []) + c.get("args", [])),
    )
    listen = env_refs(c).get("DEPROV_LISTEN", (None, ""))
    report.check(
        listen[0] == "value" and "http" in api_ports and port_of(listen[1]) == api_ports["http"],
        f"deprov-api: DEPROV_LISTEN {listen[1]} is on the container port `http` ({api_ports.get('http')})",
    )
    report.check(probe_path_port(c.get("livenessProbe")) == ("/healthz", "http"), "deprov-api: liveness GET /healthz on http")
    report.check(probe_path_port(c.get("readinessProbe")) == ("/readyz", "http"), "deprov-api: readiness GET /readyz on http")
    service = index.get(("Service", "deprov"))
    if service:
        sel = {"matchLabels": service["spec"]["selector"]}
        report.check(
            selects(sel, pod_labels(api)) and not selects(sel, pod_labels(worker)) and not selects(sel, pod_labels(job)),
            "Service deprov selects the API pods only",
        )
        for p in service["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            report.check(
                target in api_ports or target in api_ports.values(),
                f"Service deprov: targetPort {target} is a port of the API container",
            )

    print("== deprov worker")
    c = container(worker)
    worker_ports = named_ports(worker)
    report.check(
        c.get("command", []) + c.get("args", []) == ["deprov", "worker"],
        "deprov-worker runs `deprov worker`",
        " ".join(c.get("command", []) + c.get("args", [])),
    )
    metrics = env_refs(c).get("DEPROV_METRICS_LISTEN", (None, ""))
    report.check(
        metrics[0] == "value" and "metrics" in worker_ports and port_of(metrics[1]) == worker_ports["metrics"],
        f"deprov-worker: DEPROV_METRICS_LISTEN {metrics[1]} is on the container port `metrics` ({worker_ports.get('metrics')})",
    )
    report.check(
        probe_path_port(c.get("livenessProbe")) == ("/healthz", "metrics"), "deprov-worker: liveness GET /healthz on metrics"
    )
    with open(args.toml, "rb") as f:
        config = tomllib.load(f)
    lease = duration_seconds(config.get("worker", {}).get("lease", "30s"))
    grace = pod_spec(worker).get("terminationGracePeriodSeconds", 30)
    report.check(grace > lease, f"deprov-worker: terminationGracePeriodSeconds {grace} > [worker] lease {lease:g}s")

    print("== deprov migrate")
    c = container(job)
    report.check(
        c.get("command", []) + c.get("args", []) == ["deprov", "migrate"],
        "deprov-migrate runs `deprov migrate`",
        " ".join(c.get("command", []) + c.get("args", [])),
    )
    job_env = effective_env(c, configmaps)
    api_env = effective_env(container(api), configmaps)
    worker_env = effective_env(container(worker), configmaps)
    if job_env is None:
        report.skip("deprov-migrate: its envFrom ConfigMaps are generated by kustomize")
    else:
        report.check(
            job_env.get("DEPROV_POOLER_MODE", "session") == "session",
            "deprov-migrate: DEPROV_POOLER_MODE session (migrate refuses transaction)",
        )
    job_url = env_refs(c).get("DEPROV_DATABASE_URL")
    report.check(job_url is not None and job_url[0] == "secret", "deprov-migrate: DEPROV_DATABASE_URL from a Secret")
    report.check(pod_spec(job).get("restartPolicy") in ("Never", "OnFailure"), "deprov-migrate: restartPolicy Never or OnFailure")

    print("== settings of serve and worker")
    if api_env is None or worker_env is None:
        report.skip("DEPROV_POOLER_MODE, DEPROV_MIGRATE, DEPROV_CONFIG: the env ConfigMap is generated by kustomize")
    else:
        for name, env, doc in (("deprov-api", api_env, api), ("deprov-worker", worker_env, worker)):
            mode = env.get("DEPROV_POOLER_MODE", "session")
            report.check(mode in ("session", "transaction"), f"{name}: DEPROV_POOLER_MODE is {mode}")
            if mode == "transaction":
                report.check(
                    falsy(env.get("DEPROV_MIGRATE", "true")),
                    f"{name}: DEPROV_MIGRATE false (migrating at start is refused in transaction mode)",
                )
                url = env.get("DEPROV_DATABASE_URL")
                report.check(
                    url != job_url, f"{name}: DEPROV_DATABASE_URL is the transaction pool, not the migration Job's URL"
                )
            if name == "deprov-worker" and mode == "transaction":
                report.check(
                    env.get("DEPROV_NOTIFY_URL") == job_url,
                    "deprov-worker: DEPROV_NOTIFY_URL is the session-mode URL of the migration Job (LISTEN needs a session)",
                )
            config_path = env.get("DEPROV_CONFIG")
            mounted = None
            for mount in container(doc).get("volumeMounts", []):
                if config_path and config_path.startswith(mount["mountPath"].rstrip("/") + "/"):
                    volume = next(v for v in pod_spec(doc)["volumes"] if v["name"] == mount["name"])
                    key = config_path[len(mount["mountPath"].rstrip("/")) + 1 :]
                    cm = configmaps.get(volume.get("configMap", {}).get("name"), {})
                    mounted = cm.get("data", {}).get(key)
            with open(args.toml, encoding="utf-8") as f:
                report.check(
                    mounted == f.read(),
                    f"{name}: DEPROV_CONFIG {config_path} is {args.toml}, mounted from its ConfigMap",
                )
            needed = set()
            for source in config.get("sources", {}).values():
                if "token_env" in source:
                    needed.add(source["token_env"])
                needed.update(source.get("secret_env", []))
            notifications = config.get("notifications", {})
            if "secret_env" in notifications and name == "deprov-worker":
                needed.add(notifications["secret_env"])
            for var in sorted(needed):
                report.check(
                    isinstance(env.get(var), tuple) and env[var][0] == "secret",
                    f"{name}: {var} (named by {pathlib.Path(args.toml).name}) set from a Secret",
                )

    print("== PodMonitor")
    monitor = index.get(("PodMonitor", "deprov"))
    if monitor:
        spec = monitor["spec"]
        with open(args.alerts, encoding="utf-8") as f:
            jobs = set(re.findall(r'\bjob="([^"]+)"', f.read()))
        report.check(len(jobs) == 1, f"{args.alerts} selects one job: {sorted(jobs)}")
        alert_job = next(iter(jobs), None)
        job_label = spec.get("jobLabel")
        for name, doc in (("deprov-api", api), ("deprov-worker", worker)):
            labels = pod_labels(doc)
            report.check(selects(spec["selector"], labels), f"PodMonitor selects the {name} pods")
            report.check(
                job_label is not None and labels.get(job_label) == alert_job,
                f'PodMonitor: {name} pods get job="{labels.get(job_label)}" (jobLabel {job_label}), the alerts\' job="{alert_job}"',
            )
        report.check(not selects(spec["selector"], pod_labels(job)), "PodMonitor does not select the migration Job")
        endpoints = spec.get("podMetricsEndpoints", [])
        for e in endpoints:
            report.check(
                e.get("port") in api_ports or e.get("port") in worker_ports,
                f"PodMonitor endpoint port {e.get('port')} is a named container port",
            )
            report.check(e.get("path", "/metrics") == "/metrics", f"PodMonitor endpoint {e.get('port')}: path /metrics")
        ports = {e.get("port") for e in endpoints}
        report.check("http" in ports, "PodMonitor scrapes the API on http (DEPROV_LISTEN)")
        report.check("metrics" in ports, "PodMonitor scrapes the workers on metrics (DEPROV_METRICS_LISTEN)")

    print("== PodDisruptionBudgets")
    pdbs = [d for _, d in docs if d.get("kind") == "PodDisruptionBudget"]
    for name, doc in (("deprov-api", api), ("deprov-worker", worker)):
        covering = [p["metadata"]["name"] for p in pdbs if selects(p["spec"]["selector"], pod_labels(doc))]
        report.check(len(covering) == 1, f"{name} pods are covered by one PodDisruptionBudget", str(covering))
        if covering:
            pdb = next(p for p in pdbs if p["metadata"]["name"] == covering[0])
            replicas = doc["spec"].get("replicas", 1)
            allowed = pdb["spec"].get("maxUnavailable")
            if allowed is None:
                allowed = replicas - pdb["spec"].get("minAvailable", replicas)
            report.check(
                isinstance(allowed, str) or allowed >= 1,
                f"{covering[0]} lets a node drain proceed ({replicas} replicas, {allowed} may be disrupted)",
            )

    print("== NetworkPolicies")
    policies = [d for _, d in docs if d.get("kind") == "NetworkPolicy"]
    for name, doc in workloads.items():
        labels = pod_labels(doc)
        mine = [p for p in policies if selects(p["spec"]["podSelector"], labels)]
        for kind in ("Ingress", "Egress"):
            report.check(
                any(kind in p["spec"].get("policyTypes", []) for p in mine),
                f"{name}: {kind.lower()} restricted by a NetworkPolicy",
            )
    for name, doc, port_name in (("deprov-api", api, "http"), ("deprov-worker", worker, "metrics")):
        labels, number = pod_labels(doc), named_ports(doc).get(port_name)
        allowed = any(
            port.get("port") in (number, port_name)
            for p in policies
            if selects(p["spec"]["podSelector"], labels)
            for rule in p["spec"].get("ingress", [])
            for port in rule.get("ports", [])
        )
        report.check(allowed, f"{name}: ingress to {port_name} ({number}) allowed")

    print("== PrometheusRule")
    rule = index.get(("PrometheusRule", "deprov"))
    if rule:
        with open(args.alerts, encoding="utf-8") as f:
            groups = yaml.safe_load(f)["groups"]
        have = rule.get("spec", {}).get("groups")
        names = [g["name"] for g in groups]
        report.check(have == groups, f"PrometheusRule spec.groups equal {args.alerts}'s groups {names}")
        if have != groups:
            by_name = {g.get("name"): g for g in have or []}
            for g in groups:
                if by_name.get(g["name"]) != g:
                    print(f"     group {g['name']} differs or is missing", file=sys.stderr)
            for extra in set(by_name) - set(names):
                print(f"     group {extra} is not in {args.alerts}", file=sys.stderr)
    return report.failures


def run_spec(args):
    base = pathlib.Path(args.base)
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text(encoding="utf-8"))
    docs = load([base / r for r in kustomization["resources"]])
    # The generated ConfigMaps as effective_env reads them: their literals as data.
    configmaps = {
        gen["name"]: {"data": dict(lit.split("=", 1) for lit in gen.get("literals", []))}
        for gen in kustomization.get("configMapGenerator", [])
    }
    kind, name = args.workload.split("/", 1)
    found = [d for _, d in docs if d.get("kind") == kind and d.get("metadata", {}).get("name") == name]
    if len(found) != 1:
        print(f"{args.workload}: not one object of {base}", file=sys.stderr)
        return 1
    secrets = json.loads(pathlib.Path(args.secrets).read_text(encoding="utf-8"))
    env = effective_env(container(found[0]), configmaps)
    if env is None:
        print(f"{args.workload}: envFrom names a ConfigMap {base} does not generate", file=sys.stderr)
        return 1
    for var, value in env.items():
        if isinstance(value, tuple):
            if value[0] != "secret" or f"{value[1]}/{value[2]}" not in secrets:
                print(f"{args.workload}: no value for {var} ({value}) in {args.secrets}", file=sys.stderr)
                return 1
            env[var] = secrets[f"{value[1]}/{value[2]}"]
    for setting in args.set:
        var, value = setting.split("=", 1)
        if var not in env:
            print(f"{args.workload} does not set {var}: --set {setting} refused", file=sys.stderr)
            return 1
        env[var] = value
    c = container(found[0])
    for word in c.get("command", []) + c.get("args", []):
        print(f"ARG {word}")
    for var, value in env.items():
        print(f"ENV {var}={value}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_split = sub.add_parser("split")
    p_split.add_argument("outdir")
    p_split.add_argument("files", nargs="+")
    p_check = sub.add_parser("check")
    p_check.add_argument("--alerts", required=True)
    p_check.add_argument("--toml", required=True)
    p_check.add_argument("files", nargs="+")
    p_run = sub.add_parser("run-spec")
    p_run.add_argument("--base", required=True)
    p_run.add_argument("--secrets", required=True)
    p_run.add_argument("--set", action="append", default=[])
    p_run.add_argument("workload")
    args = parser.parse_args()
    if args.command == "run-spec":
        return run_spec(args)
    if args.command == "split":
        split(args.outdir, args.files)
        return 0
    failures = run_checks(args)
    if failures:
        print(f"{failures} manifest check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
