#!/usr/bin/env python3
"""Checks Knitter's Kubernetes objects against Kubernetes' own schemas.

  k8s-validate.py manifests              deploy/kubernetes: each overlay rendered by
                                         `kubectl kustomize` and the examples, against the
                                         Kubernetes OpenAPI schemas (kubernetes-validate,
                                         strict, pinned to the oldest version Knitter
                                         supports); their Network and IPGroup objects
                                         against Knitter's CRDs, a NAD against Multus's
                                         NAD CRD (its config read as a conflist)
  k8s-validate.py objects CRD FILE       each object of FILE (a JSON list) against the
                                         openAPIV3Schema of CRD (a CustomResourceDefinition
                                         YAML): custom resources as the controller wrote
                                         them, NADs against Multus's NAD CRD

Needs `pip install kubernetes-validate==1.37.0` (it brings jsonschema and PyYAML).
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import jsonschema
import yaml

KUBERNETES = "1.33.0"  # the k8s-openapi feature in Cargo.toml (v1_33)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def kubernetes_validate(files):
    subprocess.run([sys.executable, "-m", "kubernetes_validate", "--quiet", "--strict", "-k", KUBERNETES, *files], check=True)


def crd_schema(crd, version):
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)


def is_builtin(doc):
    """Whether Kubernetes itself defines the object's kind (custom resources have a dotted
    group that is not one of Kubernetes' own)."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def conflist_ok(where, config):
    """A NAD's config: a conflist whose plugins name knitter-cni and a network."""
    try:
        conf = json.loads(config)
        ok = conf["cniVersion"] and conf["name"] and all(p["type"] == "knitter-cni" and p["network"] for p in conf["plugins"])
    except (ValueError, KeyError, TypeError) as e:
        print(f"{where}: spec.config is not a conflist: {e}", file=sys.stderr)
        return False
    if not ok:
        print(f"{where}: spec.config's plugins are not knitter-cni with a network", file=sys.stderr)
    return bool(ok)


def policy(path):
    """What the rendered setup grants and mounts, against the boundaries the docs promise:
    the managers may patch pods only where one runs --network-status, may update
    networks/finalizers (blockOwnerDeletion) where one makes NADs, serve TLS with a bootstrap
    token; nodes verify the managers' CA and carry neither the admin token nor the managers'
    key. Returns the problems found."""
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    problems = []
    by_kind = lambda k: [d for d in docs if d.get("kind") == k]
    pod_spec = lambda d: d["spec"]["template"]["spec"]
    managers = [d for d in by_kind("StatefulSet") + by_kind("Deployment") if d["metadata"]["name"] == "knitter-manager"]
    nodes = [d for d in by_kind("DaemonSet") if d["metadata"]["name"] == "knitter-node"]
    if not managers or not nodes:
        return problems
    args = [a for m in managers for c in pod_spec(m)["containers"] for a in c.get("args", []) + c.get("command", [])]
    roles = {r["metadata"]["name"]: r for r in by_kind("ClusterRole")}
    granted = set()
    for b in by_kind("ClusterRoleBinding"):
        if any(s.get("name") == "knitter-manager" for s in b.get("subjects", [])):
            for rule in roles.get(b["roleRef"]["name"], {}).get("rules", []):
                granted |= {(res, verb) for res in rule["resources"] for verb in rule["verbs"]}
    status = "--network-status" in args
    if (("pods", "patch") in granted) != status:
        problems.append(f"the managers {'need' if status else 'must not have'} patch on pods ({'with' if status else 'without'} --network-status)")
    if "--network-resources" in args and ("networks/finalizers", "update") not in granted:
        problems.append("the managers make NADs owned by Networks (blockOwnerDeletion): they need update on networks/finalizers")
    for flag in ["--tls-cert=", "--tls-key=", "--bootstrap-token-file="]:
        if not any(a.startswith(flag) for a in args):
            problems.append(f"the managers run without {flag[:-1]}")
    for d in managers + nodes:
        spec, name = pod_spec(d), d["metadata"]["name"]
        if spec.get("nodeSelector", {}).get("kubernetes.io/os") != "linux":
            problems.append(f"{name} may be scheduled on nodes that are not Linux (nodeSelector kubernetes.io/os)")
        privileged = any(c.get("securityContext", {}).get("privileged") for c in spec["containers"])
        if not privileged and spec.get("securityContext", {}).get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{name} runs without the runtime's default seccomp profile")
    for m in managers:
        if not pod_spec(m).get("priorityClassName"):
            problems.append("the managers have no priorityClassName: nodes attach nothing while none runs")
    for ns in by_kind("Namespace"):
        if ns["metadata"].get("labels", {}).get("pod-security.kubernetes.io/enforce") != "privileged":
            problems.append(f"namespace {ns['metadata']['name']} does not set the Pod Security level its node agent needs (privileged)")
    node_args = [a for n in nodes for c in pod_spec(n)["containers"] for a in c.get("args", []) + c.get("command", [])]
    if any(a.startswith("--manager-token-file") for a in node_args):
        problems.append("nodes carry a manager token file: they join with the bootstrap token instead")
    if not any(a.startswith("--manager-ca=") for a in node_args):
        problems.append("nodes reach the managers without verifying their certificate (--manager-ca)")
    for n in nodes:
        for v in pod_spec(n).get("volumes", []):
            secret = v.get("secret", {})
            name, items = secret.get("secretName"), [i["key"] for i in secret.get("items", [])]
            if name == "knitter-token" or (name == "knitter-manager-tls" and items != ["ca.crt"]):
                problems.append(f"nodes mount {name} {items or '(every key)'}: the admin token or the managers' key")
    return [f"{os.path.basename(path)}: {p}" for p in problems]


def cel_failures(schema, value, old=None, path="$"):
    """The x-kubernetes-validations rules (CEL, as the apiserver evaluates them: `self` the
    value where the rule sits, `oldSelf` its value before an update, transition rules only on
    updates) that `value` breaks, as (path, message)."""
    import celpy
    failures = []
    if value is None:
        return failures
    env = celpy.Environment()
    for r in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in r["rule"] and old is None:
            continue
        activation = {"self": celpy.json_to_cel(value)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(old)
        result = env.program(env.compile(r["rule"])).evaluate(activation)
        if not isinstance(result, celpy.celtypes.BoolType) or not bool(result):
            failures.append((path, r.get("message", r["rule"])))
    if isinstance(value, dict):
        for k, sub in schema.get("properties", {}).items():
            if k in value:
                failures += cel_failures(sub, value[k], old.get(k) if isinstance(old, dict) else None, f"{path}.{k}")
    elif isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            failures += cel_failures(schema["items"], v, None, f"{path}[{i}]")
    return failures


def cel_rules(schema):
    """Every CEL rule of a schema."""
    rules = [r["rule"] for r in schema.get("x-kubernetes-validations", [])]
    for sub in schema.get("properties", {}).values():
        rules += cel_rules(sub)
    if "items" in schema:
        rules += cel_rules(schema["items"])
    return rules


# What the CRDs' CEL rules must refuse (kind, spec before an update or None, spec, the
# message) and accept (message None).
CEL_CASES = [
    ("Network", None, {"kind": "vlan", "segment": 5000}, "a VLAN network's segment is a VLAN ID, 1-4094"),
    ("Network", None, {"kind": "vlan", "segment": 4094, "sriovPool": "fast", "podChoosesVF": True}, None),
    ("Network", None, {"kind": "vxlan", "segment": 16777215}, None),
    ("Network", None, {"kind": "vxlan", "sriovPool": "fast"}, "sriovPool is for VLAN networks only"),
    ("Network", None, {"kind": "vxlan", "podChoosesVF": True}, "podChoosesVF is for VLAN networks only"),
    ("Network", None, {"kind": "vxlan", "podChoosesVF": False}, None),
    ("Network", None, {"kind": "vxlan", "podPolicer": {"burstPackets": 64}}, "a podPolicer needs a rate (pps or bps above 0)"),
    ("Network", None, {"kind": "vxlan", "podPolicer": {"pps": 0, "bps": 0}}, "a podPolicer needs a rate (pps or bps above 0)"),
    ("Network", None, {"kind": "vxlan", "podPolicer": {"bps": 1000000}}, None),
    ("Network", None, {"kind": "vlan", "masquerade": True}, "masquerade goes through the node gateway (set nodeGateway too)"),
    ("Network", None, {"kind": "vlan", "nodeGateway": True, "ipv4": {"cidr": "10.1.0.0/24"}}, "a node gateway needs each subnet's gateway address"),
    ("Network", None, {"kind": "vlan", "nodeGateway": True, "ipv4": {"cidr": "10.1.0.0/24", "gateway": "10.1.0.1"}, "ipv6": {"cidr": "fd00::/64"}}, "a node gateway needs each subnet's gateway address"),
    ("Network", None, {"kind": "vlan", "nodeGateway": True, "masquerade": True, "ipv4": {"cidr": "10.1.0.0/24", "gateway": "10.1.0.1"}}, None),
    ("Network", {"kind": "vxlan", "segment": 1}, {"kind": "vxlan", "segment": 2}, "a Network's spec is immutable (delete the Network and make it again to change it)"),
    ("Network", {"kind": "vxlan", "segment": 1}, {"kind": "vxlan", "segment": 1}, None),
    ("IPGroup", None, {"network": "red", "members": ["10.0.0.1"], "size": 1}, "give members or size, one of them"),
    ("IPGroup", None, {"network": "red"}, "give members or size, one of them"),
    ("IPGroup", None, {"network": "red", "members": []}, "give members or size, one of them"),
    ("IPGroup", None, {"network": "red", "size": 4}, None),
    ("IPGroup", None, {"network": "red", "members": ["10.0.0.1"]}, None),
    ("IPGroup", {"network": "red", "size": 4}, {"network": "red", "size": 5}, "an IPGroup's spec is immutable (delete the IPGroup and make it again to change it)"),
]


def cel(crds, examples):
    """Every rule compiles; the examples pass; CEL_CASES hold. Returns the problems."""
    import celpy
    problems = []
    env = celpy.Environment()
    by_kind = {kind: crd_schema(crd, crd["spec"]["versions"][0]["name"]) for (group, kind), crd in crds.items() if group == "knitter.io"}
    for kind, schema in by_kind.items():
        for rule in cel_rules(schema):
            try:
                env.compile(rule)
            except Exception as e:
                problems.append(f"{kind}: rule {rule!r} does not compile: {e}")
    for f, d in examples:
        if d["kind"] in by_kind:
            for path, msg in cel_failures(by_kind[d["kind"]], d) + cel_failures(by_kind[d["kind"]], d, d):
                problems.append(f"{f}: {d['metadata']['name']}: {path}: {msg}")
    for kind, old, spec, want in CEL_CASES:
        obj = {"apiVersion": "knitter.io/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": spec}
        prev = None if old is None else {**obj, "spec": old}
        got = [m for _, m in cel_failures(by_kind[kind], obj, prev)]
        if (want is None and got) or (want is not None and want not in got):
            problems.append(f"CEL case {kind} {spec} (before: {old}): expected {want or 'no refusal'}, got {got or 'no refusal'}")
    return problems


def monitoring(base, rendered):
    """The Prometheus Operator's PodMonitor and ServiceMonitor (no CRD here to validate them
    against) select what the manifests make: the node agents' pods with a `metrics` port
    (patches/node-metrics.yaml), the managers' Service with its `rest` port, Secrets that
    secrets.sh makes; and every metric the Grafana dashboard plots is one the code exports."""
    problems = []
    docs = [d for f in rendered for d in yaml.safe_load_all(open(f)) if d]
    pod_spec = lambda d: d["spec"]["template"]["spec"]
    with open(os.path.join(base, "secrets.sh")) as fh:
        made = set(re.findall(r"create secret generic ([a-z-]+)", fh.read()))

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())

    for f in sorted(glob.glob(os.path.join(base, "monitoring", "*.yaml"))):
        for m in (d for d in yaml.safe_load_all(open(f)) if d):
            name = f"{os.path.basename(f)} {m['kind']}"
            if m["kind"] == "PodMonitor":
                pods = [pod_spec(d) | {"labels": d["spec"]["template"]["metadata"].get("labels", {})} for d in docs if d["kind"] == "DaemonSet"]
                ports = [p.get("name") for pod in pods if selects(m["spec"]["selector"], pod["labels"]) for c in pod["containers"] for p in c.get("ports", [])]
                for e in m["spec"]["podMetricsEndpoints"]:
                    if e["port"] not in ports:
                        problems.append(f"{name}: no selected pod has a port {e['port']!r} (patches/node-metrics.yaml)")
            elif m["kind"] == "ServiceMonitor":
                services = [d for d in docs if d["kind"] == "Service" and selects(m["spec"]["selector"], d["metadata"].get("labels", {}))]
                ports = {p.get("name") for s in services for p in s["spec"]["ports"]}
                for e in m["spec"]["endpoints"]:
                    if e["port"] not in ports:
                        problems.append(f"{name}: no selected Service has a port {e['port']!r}")
                    secrets = [e.get("authorization", {}).get("credentials", {}).get("name"), e.get("tlsConfig", {}).get("ca", {}).get("secret", {}).get("name")]
                    for s in filter(None, secrets):
                        if s not in made:
                            problems.append(f"{name}: Secret {s} is not one deploy/kubernetes/secrets.sh makes")
            else:
                problems.append(f"{name}: not a PodMonitor or ServiceMonitor")
    # Metric names as the code writes them: inside string literals of the files that render
    # /metrics (a crate path such as knitter_api is not a string).
    exported = set()
    writers = [os.path.join(ROOT, "vswitchd", "src", "metrics.rs"), os.path.join(ROOT, "control", "manager", "src", "manager", "metrics.rs"), os.path.join(ROOT, "control", "manager", "src", "manager", "cluster", "mod.rs")]
    for src in writers:
        for literal in re.findall(r'"(?:[^"\\]|\\.)*"', open(src).read()):
            exported |= set(re.findall(r"knitter_[a-z_]+", literal))
    with open(os.path.join(ROOT, "deploy", "grafana", "knitter.json")) as fh:
        dashboard = json.load(fh)
    for p in dashboard["panels"]:
        for t in p["targets"]:
            for metric in re.findall(r"knitter_[a-z_]+", t["expr"]):
                if metric not in exported:
                    problems.append(f"deploy/grafana/knitter.json: panel {p['title']!r} plots {metric}, which nothing exports")
    return problems


CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "PriorityClass"}


def outside_the_namespace(path):
    """Namespaced objects a rendered overlay leaves without `namespace: knitter` (kubectl
    would put them in the current context's namespace, away from their Secrets and service
    accounts)."""
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    return [f"{path}: {d['kind']} {d['metadata']['name']} is not in the namespace knitter"
            for d in docs if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != "knitter"]


def unselected_services(path):
    """Services of a rendered overlay whose selector matches no workload's pods (a Service
    with no endpoints: nodes would never reach the manager)."""
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    pods = [d["spec"]["template"]["metadata"].get("labels", {}) for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    return [f"{path}: Service {d['metadata']['name']} selects no workload's pods ({d['spec']['selector']})"
            for d in docs if d["kind"] == "Service" and d["spec"].get("selector")
            and not any(all(p.get(k) == v for k, v in d["spec"]["selector"].items()) for p in pods)]


def manifests():
    base = os.path.join(ROOT, "deploy", "kubernetes")
    crd_files = sorted(glob.glob(os.path.join(base, "base", "crds", "*.yaml")))
    crds = {}
    for f in crd_files:
        with open(f) as fh:
            crd = yaml.safe_load(fh)
        for v in crd["spec"]["versions"]:
            jsonschema.Draft7Validator.check_schema(v["schema"]["openAPIV3Schema"])
        crds[(crd["spec"]["group"], crd["spec"]["names"]["kind"])] = crd
    builtin, custom, rendered = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        def render(directory, name):
            out = subprocess.run(["kubectl", "kustomize", directory], check=True, capture_output=True, text=True).stdout
            path = os.path.join(tmp, name + ".yaml")
            with open(path, "w") as fh:
                fh.write(out)
            builtin.append(path)
            rendered.append(path)

        for overlay in sorted(glob.glob(os.path.join(base, "overlays", "*"))):
            render(overlay, os.path.basename(overlay))
        # Each optional patch, as its comment says to use it: beside a kustomization on an
        # overlay (kustomize reads patches only from the kustomization's own directory).
        for patch in sorted(glob.glob(os.path.join(base, "patches", "*.yaml"))):
            user = tempfile.mkdtemp(prefix=".check-", dir=base)
            try:
                shutil.copy(patch, user)
                with open(os.path.join(user, "kustomization.yaml"), "w") as fh:
                    fh.write(f"bases: [../overlays/embedded]\npatchesStrategicMerge: [{os.path.basename(patch)}]\n")
                render(user, "patch-" + os.path.basename(patch))
            finally:
                shutil.rmtree(user)
        builtin += sorted(glob.glob(os.path.join(base, "uninstall", "*.yaml")))
        for f in sorted(glob.glob(os.path.join(base, "examples", "*.yaml"))):
            with open(f) as fh:
                docs = [d for d in yaml.safe_load_all(fh) if d]
            if any(not is_builtin(d) for d in docs):
                custom += [(f, d) for d in docs]
            else:
                builtin.append(f)
        kubernetes_validate(builtin)
        broken = [p for f in builtin for p in policy(f)] + monitoring(base, builtin)
        broken += [p for f in rendered for p in outside_the_namespace(f) + unselected_services(f)]
        for p in broken:
            print(p, file=sys.stderr)
        if broken:
            sys.exit(f"{len(broken)} problems: manifests that grant or mount more than they should, objects outside the namespace, or monitoring objects that select nothing")
    with open(os.path.join(ROOT, "control", "manager", "tests", "fixtures", "multus-nad-crd.yaml")) as fh:
        nad = next(d for d in yaml.safe_load_all(fh) if d)
    crds[(nad["spec"]["group"], nad["spec"]["names"]["kind"])] = nad
    failed = 0
    for f, d in custom:
        group, version = d["apiVersion"].split("/")
        crd = crds.get((group, d["kind"]))
        if d["kind"] == "NetworkAttachmentDefinition":
            failed += not conflist_ok(f, d["spec"]["config"])
        if crd is None:
            print(f"{f}: no CRD for {d['apiVersion']} {d['kind']}", file=sys.stderr)
            failed += 1
            continue
        for e in jsonschema.Draft7Validator(crd_schema(crd, version)).iter_errors(d):
            print(f"{f}: {d['metadata']['name']}: {e.json_path}: {e.message}", file=sys.stderr)
            failed += 1
    for p in cel(crds, custom):
        print(p, file=sys.stderr)
        failed += 1
    if failed:
        sys.exit(f"{failed} problems in the example resources or the CRDs' CEL rules")
    print(f"{len(crd_files)} CRDs, {len(builtin)} manifest files and {len(custom)} example resources valid for Kubernetes {KUBERNETES}")


def objects(crd_file, objects_file):
    with open(crd_file) as fh:
        crd = next(d for d in yaml.safe_load_all(fh) if d and d.get("kind") == "CustomResourceDefinition")
    with open(objects_file) as fh:
        items = json.load(fh)
    group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
    failed = 0
    for o in items:
        version = o["apiVersion"].split("/")[-1]
        schema = crd_schema(crd, version)
        if o["apiVersion"] != f"{group}/{version}" or o["kind"] != kind:
            print(f"{o['metadata'].get('name')}: {o['apiVersion']} {o['kind']} is not {group} {kind}", file=sys.stderr)
            failed += 1
            continue
        errors = list(jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker()).iter_errors(o))
        for e in errors:
            print(f"{o['metadata'].get('namespace', '')}/{o['metadata'].get('name')}: {e.json_path}: {e.message}", file=sys.stderr)
        refused = cel_failures(schema, o)
        for path, msg in refused:
            print(f"{o['metadata'].get('namespace', '')}/{o['metadata'].get('name')}: {path}: {msg} (CEL)", file=sys.stderr)
        failed += bool(errors or refused)
    if failed:
        sys.exit(f"{failed} of {len(items)} objects do not follow {crd['metadata']['name']}")
    print(f"{len(items)} objects follow {crd['metadata']['name']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["manifests"]:
        manifests()
    elif sys.argv[1:2] == ["objects"] and len(sys.argv) == 4:
        objects(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
