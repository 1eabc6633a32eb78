#!/usr/bin/python3
"""Static checks of deploy/ (Prometheus, Grafana, Kubernetes) and scripts/run.

usage: deploy_test.py CASE [BINARY=PATH ...]     (runs from any directory)
  CASE: prometheus_config | prometheus_rules | prometheus_rule_tests | grafana |
        k8s_structure | k8s_flags | run_script | all
  BINARY=PATH: lede-model=..., lede-coordinator=..., lede-policy=..., lede-train=...
               (k8s_flags runs each with --help and checks every flag it is given)
Exit status 0 = pass, 1 = fail, 77 = skipped (a tool is missing).
"""
import json
import os
import re
import shutil
import subprocess
import sys

SKIP = 77
PROM_DIR = "deploy/prometheus"
K8S_DIR = "deploy/k8s"
METRICS_SOURCE = "shared/telemetry/lede_metrics.cc"
# The retraining service registers its own (lede-train: --watch serves them,
# --metrics-textfile writes them).
RETRAIN_METRICS_SOURCE = "trainer/retrain_metrics.cc"


class Skip(Exception):
    pass


def fail(msg):
    raise AssertionError(msg)


def promtool(*args):
    tool = shutil.which("promtool")
    if tool is None:
        raise Skip("promtool not installed")
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        fail(f"promtool {' '.join(args)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def load_yaml_docs(path):
    try:
        import yaml
    except ImportError:
        raise Skip("python3-yaml not installed")
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def known_metrics():
    names = set(re.findall(r'"(lede_[a-z0-9_]+)"', open(METRICS_SOURCE).read()))
    if len(names) < 10:
        fail(f"found only {sorted(names)} in {METRICS_SOURCE}")
    retrain = set(re.findall(r'"(lede_retrain_[a-z0-9_]+)"', open(RETRAIN_METRICS_SOURCE).read()))
    if len(retrain) < 5:
        fail(f"found only {sorted(retrain)} in {RETRAIN_METRICS_SOURCE}")
    return names | retrain


def recording_rules():
    rules = set()
    for doc in load_yaml_docs(os.path.join(PROM_DIR, "alerts.yml")):
        for group in doc["groups"]:
            rules |= {r["record"] for r in group["rules"] if "record" in r}
    return rules


def check_expr_metrics(expr, where, metrics, records):
    """Every lede_* series in a PromQL expression is a metric (or a histogram's
    _bucket/_sum/_count series) that lede_metrics.cc registers; every lede:* name
    is a recording rule."""
    for name in re.findall(r"(?<![\w:])(lede_[a-z0-9_]+)", expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in metrics and base not in metrics:
            fail(f"{where}: unknown metric {name} (not in {METRICS_SOURCE} or {RETRAIN_METRICS_SOURCE})")
    for name in re.findall(r"(?<![\w])(lede:[a-z0-9_:]+)", expr):
        if name not in records:
            fail(f"{where}: unknown recording rule {name}")


# --- Prometheus -------------------------------------------------------------

def test_prometheus_config():
    promtool("check", "config", os.path.join(PROM_DIR, "prometheus.yml"))
    (cfg,) = load_yaml_docs(os.path.join(PROM_DIR, "prometheus.yml"))
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    want = {"lede-coordinator": 9401, "lede-verifier": 9402, "lede-policy": 9403, "lede-drafter": 9404}
    for job, port in want.items():
        if job not in jobs:
            fail(f"prometheus.yml: no job {job}")
        targets = [t for sc in jobs[job]["static_configs"] for t in sc["targets"]]
        if targets != [f"127.0.0.1:{port}"]:
            fail(f"prometheus.yml: job {job} scrapes {targets}, want 127.0.0.1:{port}")
    if cfg["global"]["scrape_interval"] != "5s":
        fail("prometheus.yml: scrape_interval is not 5s")


def test_prometheus_rules():
    promtool("check", "rules", os.path.join(PROM_DIR, "alerts.yml"))
    metrics, records = known_metrics(), recording_rules()
    if "lede:acceptance_rate:rate5m" not in records:
        fail("alerts.yml: no lede:acceptance_rate:rate5m recording rule")
    alerts = set()
    for doc in load_yaml_docs(os.path.join(PROM_DIR, "alerts.yml")):
        for group in doc["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                check_expr_metrics(rule["expr"], f"alerts.yml {name}", metrics, records)
                if "alert" in rule:
                    alerts.add(rule["alert"])
                    if "severity" not in rule.get("labels", {}):
                        fail(f"alerts.yml {name}: no severity label")
    want = {"LedeProcessDown", "LedeLowAcceptanceRate", "LedeNoSuccessfulRequests", "LedeHighErrorRatio",
            "LedeExperienceDropped", "LedePolicyReloadRejected", "LedeKvSlotsSaturated"}
    if want - alerts:
        fail(f"alerts.yml: missing alerts {sorted(want - alerts)}")


def test_prometheus_rule_tests():
    # Proves, among others, that the recording rule computes accepted / drafted.
    out = promtool("test", "rules", os.path.join(PROM_DIR, "alerts_test.yml"))
    if "SUCCESS" not in out:
        fail(f"promtool test rules: {out}")


# --- Grafana ----------------------------------------------------------------

def test_grafana():
    with open("deploy/grafana/lede-dashboard.json") as f:
        dash = json.load(f)
    metrics, records = known_metrics(), recording_rules()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    if variables.get("datasource", {}).get("type") != "datasource" or \
            variables["datasource"].get("query") != "prometheus":
        fail("dashboard: no Prometheus datasource variable named 'datasource'")
    panels = [p for p in dash["panels"] if p.get("type") != "row"]
    panels += [q for p in dash["panels"] if p.get("type") == "row" for q in p.get("panels", [])]
    if len(panels) < 10:
        fail(f"dashboard: only {len(panels)} panels")
    ids = [p["id"] for p in dash["panels"]]
    if len(ids) != len(set(ids)):
        fail("dashboard: duplicate panel ids")
    used = set()
    for p in panels:
        where = f"panel {p.get('title')!r}"
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"{where}: datasource is not the ${{datasource}} variable")
        if not p.get("targets"):
            fail(f"{where}: no targets")
        for t in p["targets"]:
            if not t.get("expr"):
                fail(f"{where}: a target without expr")
            check_expr_metrics(t["expr"], where, metrics, records)
            used |= set(re.findall(r"lede_[a-z0-9_]+|lede:[a-z0-9_:]+", t["expr"]))
    for must in ("lede_generation_tokens_total", "lede_spec_decode_exit_layer_bucket",
                 "lede_spec_decode_draft_length_bucket", "lede_round_latency_seconds_bucket",
                 "lede_time_to_first_token_seconds_bucket", "lede_inter_token_latency_seconds_bucket",
                 "lede_requests_total", "lede_policy_version", "lede_kv_slots_in_use",
                 "lede_experience_records_written_total", "lede_experience_records_dropped_total",
                 "lede_spec_decode_num_accepted_tokens_total"):
        if must not in used:
            fail(f"dashboard: no panel queries {must}")


# --- Kubernetes ---------------------------------------------------------------

def k8s_objects():
    objs = []
    for name in sorted(os.listdir(K8S_DIR)):
        if not name.endswith((".yaml", ".yml")) or name == "kustomization.yaml":
            continue
        for doc in load_yaml_docs(os.path.join(K8S_DIR, name)):
            where = f"{name} {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            for key in ("apiVersion", "kind"):
                if not doc.get(key):
                    fail(f"{where}: no {key}")
            if not doc.get("metadata", {}).get("name"):
                fail(f"{where}: no metadata.name")
            if "namespace" in doc["metadata"]:
                fail(f"{where}: manifests must be namespace-agnostic")
            objs.append((where, doc))
    if not objs:
        fail(f"no manifests under {K8S_DIR}")
    return objs


def pod_templates(objs):
    """(where, pod template) of every Deployment and CronJob."""
    out = []
    for where, d in objs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out.append((where, d["spec"]["template"]))
        elif d["kind"] == "CronJob":
            out.append((where, d["spec"]["jobTemplate"]["spec"]["template"]))
    return out


def configmaps(objs):
    return {d["metadata"]["name"]: d.get("data", {}) for _, d in objs if d["kind"] == "ConfigMap"}


def config_file_of(container, template, cms):
    """(configmap key, text) of the container's --config file, or None."""
    args = list(container.get("command", [])[1:]) + list(container.get("args", []))
    path = None
    for i, a in enumerate(args):
        if a == "--config" and i + 1 < len(args):
            path = args[i + 1]
        elif a.startswith("--config="):
            path = a.split("=", 1)[1]
    if path is None:
        return None
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    for m in container.get("volumeMounts", []):
        prefix = m["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            vol = volumes.get(m["name"], {})
            if "configMap" not in vol:
                fail(f"container {container['name']}: {path} is not on a ConfigMap volume")
            cm = vol["configMap"]["name"]
            key = path[len(prefix):]
            if cm not in cms:
                fail(f"container {container['name']}: ConfigMap {cm} does not exist")
            if key not in cms[cm]:
                fail(f"container {container['name']}: --config {path}: {key} is not a key of ConfigMap {cm}")
            return key, cms[cm][key]
    fail(f"container {container['name']}: --config {path} is not under any volume mount")


def test_k8s_structure():
    objs = k8s_objects()
    kinds = {d["kind"] for _, d in objs}
    for k in ("ConfigMap", "StatefulSet", "Deployment", "Service", "CronJob", "PodDisruptionBudget",
              "HorizontalPodAutoscaler"):
        if k not in kinds:
            fail(f"no {k} in {K8S_DIR}")
    names = {(d["kind"], d["metadata"]["name"]) for _, d in objs}
    for want in (("StatefulSet", "lede-model"), ("Deployment", "lede-coordinator"),
                 ("Deployment", "lede-policy"), ("CronJob", "lede-trainer")):
        if want not in names:
            fail(f"no {want[0]} {want[1]}")
    cms = configmaps(objs)
    pvcs = {d["metadata"]["name"] for _, d in objs if d["kind"] == "PersistentVolumeClaim"}
    for where, d in objs:
        if d["kind"] in ("Deployment", "StatefulSet"):
            sel = d["spec"]["selector"]["matchLabels"]
            labels = d["spec"]["template"]["metadata"]["labels"]
            if any(labels.get(k) != v for k, v in sel.items()):
                fail(f"{where}: selector {sel} does not match template labels {labels}")
    templates = pod_templates(objs)
    used_keys = set()
    for where, t in templates:
        spec = t["spec"]
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v and v["persistentVolumeClaim"]["claimName"] not in pvcs:
                fail(f"{where}: PVC {v['persistentVolumeClaim']['claimName']} does not exist")
            if "configMap" in v and v["configMap"]["name"] not in cms:
                fail(f"{where}: ConfigMap {v['configMap']['name']} does not exist")
        vol_names = {v["name"] for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            for m in c.get("volumeMounts", []):
                if m["name"] not in vol_names:
                    fail(f"{where} container {c['name']}: mounts unknown volume {m['name']}")
            if "resources" not in c or "requests" not in c["resources"] or "limits" not in c["resources"]:
                fail(f"{where} container {c['name']}: no resource requests/limits")
            cfg = config_file_of(c, t, cms)
            if cfg:
                used_keys.add(cfg[0])
        for c in spec["containers"]:
            # Liveness = the process runs (/healthz); readiness = it can serve (/readyz).
            for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                if d_kind(where) in ("Deployment", "StatefulSet") and \
                        c.get(probe, {}).get("httpGet", {}).get("path") != path:
                    fail(f"{where} container {c['name']}: {probe} is not an HTTP GET of {path}")
    for cm, data in cms.items():
        for key in data:
            if key.endswith(".conf") and key not in used_keys:
                fail(f"ConfigMap {cm}: {key} is used by no container")
    # The verifier and drafter share /dev/shm through one in-memory emptyDir.
    (model,) = [d for _, d in objs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "lede-model"]
    spec = model["spec"]["template"]["spec"]
    shm = {v["name"] for v in spec["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"}
    names = sorted(c["name"] for c in spec["containers"])
    if names != ["drafter", "verifier"]:
        fail(f"lede-model: containers {names}, want drafter and verifier")
    for c in spec["containers"]:
        if not any(m["mountPath"] == "/dev/shm" and m["name"] in shm for m in c.get("volumeMounts", [])):
            fail(f"lede-model container {c['name']}: no in-memory emptyDir at /dev/shm")
    # Ordered stop: the coordinator's pod drains within its grace period, and
    # the model pods serve on (preStop) until the coordinator's drain is over.
    def deployment(name):
        (d,) = [d for _, d in objs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == name]
        return d["spec"]["template"]["spec"]
    def pre_stop_s(c):
        cmd = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        return int(cmd[1]) if len(cmd) == 2 and cmd[0].endswith("sleep") else 0
    def conf_grace(key):
        for data in cms.values():
            m = re.search(r"shutdown-grace-s\s*=\s*(\d+)", data.get(key, ""))
            if m:
                return int(m.group(1))
        fail(f"no shutdown-grace-s in {key}")
    coord = deployment("lede-coordinator")
    (cc,) = coord["containers"]
    drain = pre_stop_s(cc) + conf_grace("coordinator.conf")
    if coord.get("terminationGracePeriodSeconds", 30) < drain + 5:
        fail(f"lede-coordinator: terminationGracePeriodSeconds below preStop + shutdown-grace-s + 5 ({drain + 5})")
    for c in spec["containers"]:  # lede-model
        if pre_stop_s(c) < drain:
            fail(f"lede-model container {c['name']}: preStop sleep {pre_stop_s(c)} s ends before the "
                 f"coordinator's drain ({drain} s)")
        if spec.get("terminationGracePeriodSeconds", 30) < pre_stop_s(c) + conf_grace(c["name"] + ".conf"):
            fail(f"lede-model: terminationGracePeriodSeconds below preStop + shutdown-grace-s of {c['name']}")
    # Services select an existing pod template and name ports its containers have.
    for where, svc in objs:
        if svc["kind"] != "Service":
            continue
        sel = svc["spec"]["selector"]
        matched = [t for _, t in templates
                   if all(t["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not matched:
            fail(f"{where}: selector {sel} matches no pod template")
        ann = svc["metadata"].get("annotations", {})
        if ann.get("prometheus.io/scrape") != "true" or "prometheus.io/port" not in ann:
            fail(f"{where}: no prometheus.io/scrape and prometheus.io/port annotations")
        for t in matched:
            cports = [p for c in t["spec"]["containers"] for p in c.get("ports", [])]
            by_name = {p.get("name") for p in cports}
            by_number = {p["containerPort"] for p in cports}
            for p in svc["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                if tp not in by_name and tp not in by_number:
                    fail(f"{where}: targetPort {tp} is not a container port of the selected pods")
            if int(ann["prometheus.io/port"]) not in by_number:
                fail(f"{where}: prometheus.io/port {ann['prometheus.io/port']} is not a container port")


    check_k8s_replicas(objs, templates, cms)


def check_k8s_replicas(objs, templates, cms):
    """Several model replicas behind the coordinators, policies through the
    object store: the model StatefulSet's serviceName is a headless Service
    whose ports are the verifier's and drafter's, coordinator.conf discovers
    the replicas through it on those ports, no volume is shared between the
    trainer and the policy service (both follow the policy store), and every
    PodDisruptionBudget and HorizontalPodAutoscaler points at a workload."""
    (model,) = [d for _, d in objs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "lede-model"]
    headless = [d for _, d in objs if d["kind"] == "Service" and d["metadata"]["name"] == model["spec"]["serviceName"]]
    if len(headless) != 1 or headless[0]["spec"].get("clusterIP") != "None":
        fail(f"lede-model: serviceName {model['spec']['serviceName']} is not a headless Service (clusterIP: None)")
    ports = {p["port"] for p in headless[0]["spec"]["ports"]}
    conf = cms.get("lede-config", {}).get("coordinator.conf", "")
    def conf_value(key):
        m = re.search(r"^\s*" + re.escape(key) + r"\s*=\s*(\S+)", conf, re.M)
        return m.group(1) if m else None
    if conf_value("replica-dns") != headless[0]["metadata"]["name"]:
        fail(f"coordinator.conf: replica-dns is {conf_value('replica-dns')}, not the headless Service "
             f"{headless[0]['metadata']['name']}")
    for key in ("replica-verifier-port", "replica-drafter-port"):
        if conf_value(key) is None or int(conf_value(key)) not in ports:
            fail(f"coordinator.conf: {key} {conf_value(key)} is not a port of Service {headless[0]['metadata']['name']}")
    for key in ("verifier", "drafter"):
        if conf_value(key) is not None:
            fail(f"coordinator.conf: {key} = ... names one replica; the replicas come from replica-dns")
    def claims(name):
        for where, t in templates:
            if where.split()[2] == name:
                return {v["persistentVolumeClaim"]["claimName"] for v in t["spec"].get("volumes", [])
                        if "persistentVolumeClaim" in v}
        fail(f"no pod template {name}")
    shared = claims("lede-trainer") & claims("lede-policy")
    if shared:
        fail(f"lede-trainer and lede-policy share volumes {sorted(shared)}: policies go through the object store")
    policy_store = re.search(r"^\s*policy-store\s*=\s*(\S+)", cms["lede-config"].get("policy.conf", ""), re.M)
    (trainer,) = [t for where, t in templates if where.split()[2] == "lede-trainer"]
    targs = trainer["spec"]["containers"][0]["args"]
    if policy_store is None or "--policy-store" not in targs or \
            targs[targs.index("--policy-store") + 1] != policy_store.group(1):
        fail("lede-trainer publishes to another --policy-store than policy.conf's policy-store")
    workloads = {(d["kind"], d["metadata"]["name"]): d for _, d in objs
                 if d["kind"] in ("Deployment", "StatefulSet")}
    for where, d in objs:
        if d["kind"] == "PodDisruptionBudget":
            sel = d["spec"]["selector"]["matchLabels"]
            if not any(all(t["metadata"]["labels"].get(k) == v for k, v in sel.items()) for _, t in templates):
                fail(f"{where}: selector {sel} matches no pod template")
        if d["kind"] == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            if (ref["kind"], ref["name"]) not in workloads:
                fail(f"{where}: scaleTargetRef {ref['kind']} {ref['name']} does not exist")
    check_k8s_gpu_overlay(objs)


def check_k8s_gpu_overlay(objs):
    """deploy/k8s-gpu patches workloads and containers that exist, lists its
    files, and gives the model replicas a GPU."""
    gpu_dir = "deploy/k8s-gpu"
    (kust,) = load_yaml_docs(os.path.join(gpu_dir, "kustomization.yaml"))
    if kust.get("resources") != ["../k8s"]:
        fail(f"{gpu_dir}/kustomization.yaml: resources {kust.get('resources')}, want ['../k8s']")
    workloads = {(d["kind"], d["metadata"]["name"]): d for _, d in objs}
    gpu = False
    for patch in kust.get("patches", []):
        (doc,) = load_yaml_docs(os.path.join(gpu_dir, patch["path"]))
        target = workloads.get((doc["kind"], doc["metadata"]["name"]))
        if target is None:
            fail(f"{gpu_dir}/{patch['path']}: patches {doc['kind']} {doc['metadata']['name']}, which does not exist")
        names = {c["name"] for c in target["spec"]["template"]["spec"]["containers"]}
        for c in doc["spec"]["template"]["spec"].get("containers", []):
            if c["name"] not in names:
                fail(f"{gpu_dir}/{patch['path']}: container {c['name']} is not in {doc['metadata']['name']}")
            gpu |= "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
    if not gpu:
        fail(f"{gpu_dir}: no container gets an nvidia.com/gpu limit")
    for gen in kust.get("configMapGenerator", []):
        for f in gen.get("files", []):
            if not os.path.exists(os.path.join(gpu_dir, f)):
                fail(f"{gpu_dir}/kustomization.yaml: {f} does not exist")


def d_kind(where):
    return where.split()[1]


def usage_text(binary):
    r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    return r.stdout + r.stderr


def test_k8s_flags(binaries):
    objs = k8s_objects()
    cms = configmaps(objs)
    missing = [n for n in ("lede-model", "lede-coordinator", "lede-policy", "lede-train")
               if not os.access(binaries.get(n, ""), os.X_OK)]
    if missing:
        raise Skip(f"binaries not built or not given: {missing}")
    usages = {}
    checked = 0
    for where, t in pod_templates(objs):
        for c in t["spec"]["containers"]:
            binary = os.path.basename(c["command"][0])
            if binary not in binaries:
                fail(f"{where} container {c['name']}: unknown binary {c['command'][0]}")
            if binary not in usages:
                usages[binary] = usage_text(binaries[binary])
            flags = [(a[2:].split("=", 1)[0], "args") for a in c["command"][1:] + c.get("args", [])
                     if a.startswith("--")]
            cfg = config_file_of(c, t, cms)
            if cfg:
                for n, line in enumerate(cfg[1].splitlines(), 1):
                    line = line.split("#", 1)[0].strip()
                    if line:
                        name = re.split(r"[=:]", line, 1)[0].strip().removeprefix("--")
                        flags.append((name, f"{cfg[0]}:{n}"))
            for name, origin in flags:
                checked += 1
                if not re.search(r"(?<![\w-])--" + re.escape(name) + r"(?![\w-])", usages[binary]):
                    fail(f"{where} container {c['name']} ({origin}): {binary} does not accept --{name}")
    print(f"{checked} flags checked")


def test_run_script():
    r = subprocess.run(["bash", "-n", "scripts/run"], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"bash -n scripts/run: {r.stderr}")
    r = subprocess.run(["bash", "scripts/run", "--help"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0 or "--detach" not in r.stdout:
        fail(f"scripts/run --help: rc {r.returncode}: {r.stdout}{r.stderr}")


CASES = {
    "prometheus_config": test_prometheus_config,
    "prometheus_rules": test_prometheus_rules,
    "prometheus_rule_tests": test_prometheus_rule_tests,
    "grafana": test_grafana,
    "k8s_structure": test_k8s_structure,
    "k8s_flags": test_k8s_flags,
    "run_script": test_run_script,
}


def main(argv):
    if len(argv) < 2 or (argv[1] not in CASES and argv[1] != "all"):
        print(__doc__, file=sys.stderr)
        return 2
    binaries = {k: os.path.abspath(v) for k, v in (a.split("=", 1) for a in argv[2:])}
    os.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    cases = list(CASES) if argv[1] == "all" else [argv[1]]
    skipped = failed = 0
    for name in cases:
        fn = CASES[name]
        try:
            fn(binaries) if name == "k8s_flags" else fn()
            print(f"PASS {name}")
        except Skip as e:
            skipped += 1
            print(f"SKIP {name}: {e}")
        except AssertionError as e:
            failed += 1
            print(f"FAIL {name}: {e}")
    if failed:
        return 1
    return SKIP if skipped == len(cases) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
