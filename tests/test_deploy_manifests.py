"""deploy/k8s: every overlay renders with kustomize (the pinned kubectl wheel) and every rendered
object validates offline against the Kubernetes schemas of 1.32 and 1.37 (kubernetes-validate,
strict: an unknown or misspelt field fails); PodMonitor and PrometheusRule against the stated
subset of the operator's API; no image without a pinned tag; the shapes the issue asks for: probes
on the container's own port, a grace period above preStop + drain, GPUs for SGLang, memory for the
reference engine's KV cache at the manifest's own --max-running and --max-len, the canary."""

from __future__ import annotations

import json
import runpy

import jsonschema
import kubernetes_validate
import pytest
from deploy_manifests import CRD_KINDS, K8S, OVERLAYS, POD_KINDS, RENDERED, containers, render

from sglang_dspark import launch

ROOT = K8S.parents[1]
FLUSH_S = runpy.run_path(str(ROOT / "sglang_dspark" / "server" / "runner.py"))["FLUSH_S"]  # without the app
K8S_VERSIONS = ("1.32.0", "1.37.0")  # the oldest minor we state support for, and the newest the package has
PRESTOP_MAX_S = 20  # base/replica.yaml: router_workers leave --timeout 20
# SmolLM2-135M (the CPU overlay's model) in float32: 30 layers x 3 KV heads x 64 x (K, V) x 4 B per
# position, 1.5 KiB of drafter context, 135 M parameters x 4 B of weights (launch --max-len --help)
KV_BYTES_PER_POSITION = 30 * 3 * 64 * 2 * 4 + 1536
WEIGHT_BYTES = 135e6 * 4


def _objects():
    return [(name, doc) for name in RENDERED for doc in render(name)]


def _quantity_bytes(q: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    unit = next((u for u in sorted(units, key=len, reverse=True) if q.endswith(u)), "")
    return float(q.removesuffix(unit)) * units.get(unit, 1)


def test_every_shape_the_issue_names_is_an_overlay():
    assert set(OVERLAYS) == {"cpu-reference", "gpu-sglang", "multinode-tp", "router", "canary"}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", RENDERED)
def test_rendered_objects_validate_against_the_kubernetes_schemas(name, version):
    docs = [d for d in render(name) if d["kind"] not in CRD_KINDS]
    assert docs or name == "monitoring"
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name}: {doc['kind']}/{doc['metadata']['name']} on {version}: {exc}") from None


def test_operator_kinds_validate_against_the_stated_subset():
    schema = json.loads((K8S / "monitoring" / "operator-subset.schema.json").read_text())
    crds = [(name, d) for name, d in _objects() if d["kind"] in CRD_KINDS]
    assert {d["kind"] for _, d in crds} == CRD_KINDS
    for name, doc in crds:
        errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(doc)]
        assert not errors, (name, doc["metadata"]["name"], errors)


def test_every_image_has_a_pinned_tag():
    images = {c["image"] for name in OVERLAYS for _, c in containers(name)}
    assert images
    for image in images:
        repo, _, tag = image.rpartition(":")
        assert "/" in repo and tag and "/" not in tag and tag != "latest", f"{image}: no pinned tag"


def _launch_args(container: dict):
    assert container["command"] == ["python", "-m", "sglang_dspark.launch"]
    return launch.build_parser().parse_args(container["args"])


def _replicas():
    return [(name, doc, c) for name in OVERLAYS for doc, c in containers(name)
            if c["command"][-1] == "sglang_dspark.launch"]


def test_probes_use_the_port_the_replica_listens_on():
    checked = 0
    for name, _, c in _replicas() + [(n, d, c) for n in ["router"] for d, c in containers(n)]:
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                port = c[probe]["httpGet"]["port"]
                assert port in ports, (name, probe, port)
                checked += 1
        if c["command"][-1] == "sglang_dspark.launch" and "readinessProbe" in c:
            assert ports["http"] == _launch_args(c).port, name
    assert checked >= 10


def test_grace_period_outlasts_the_prestop_hook_and_the_drain():
    for name, doc, c in _replicas():
        args = _launch_args(c)
        grace = doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        if args.engine == "reference":  # the server drains for --drain-timeout, then flushes
            assert grace > PRESTOP_MAX_S + args.drain_timeout + FLUSH_S, name
        else:  # SGLang drains with no limit: the grace period is the bound, long requests included
            assert grace >= 300, name
        if "readinessProbe" in c:  # a routed replica leaves the router before SIGTERM
            hook = c["lifecycle"]["preStop"]["exec"]["command"]
            assert "sglang_dspark.router_workers leave" in hook[-1] and f"--timeout {PRESTOP_MAX_S}" in hook[-1], name


def test_resources_fit_the_engine():
    for name, _, c in _replicas():
        args, res = _launch_args(c), c["resources"]
        if args.engine == "sglang":
            gpus = int(res["requests"]["nvidia.com/gpu"])
            assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"], name
            assert gpus * args.nnodes == args.tp * args.dp, name  # one GPU per rank, on every node
        else:  # the KV cache the server may commit at its own --max-running x --max-len, plus the weights
            need = args.max_running * args.max_len * KV_BYTES_PER_POSITION + WEIGHT_BYTES
            assert _quantity_bytes(res["requests"]["memory"]) > need, (name, need / 2**30)
            assert _quantity_bytes(res["limits"]["memory"]) >= _quantity_bytes(res["requests"]["memory"]), name


def test_tensor_parallel_nodes_split_the_gpus_and_agree_on_the_rendezvous():
    nodes = sorted((_launch_args(c) for _, _, c in _replicas() if _launch_args(c).nnodes > 1),
                   key=lambda a: a.node_rank)
    assert [a.node_rank for a in nodes] == list(range(nodes[0].nnodes))
    assert len({(a.tp, a.nnodes, a.dist_init_addr, a.model, a.draft, a.mode) for a in nodes}) == 1
    leader = next(d for d in render("multinode-tp") if d["metadata"]["name"] == "dspark-tp-leader")
    host = nodes[0].dist_init_addr.split(":")[0]
    assert host == f"{leader['metadata']['name']}-0.{leader['spec']['serviceName']}"
    gpus = [int(c["resources"]["requests"]["nvidia.com/gpu"]) for _, c in containers("multinode-tp")]
    assert sum(gpus) == nodes[0].tp


def test_the_canary_is_its_own_deployment_of_one_labelled_canary():
    deployments = [d for d in render("canary") if d["kind"] == "Deployment"]
    assert len(deployments) == 1
    canary = deployments[0]
    assert canary["spec"]["replicas"] == 1
    assert canary["metadata"]["name"] != "dspark-replica"  # applied beside the fleet, not over it
    assert canary["spec"]["selector"]["matchLabels"]["role"] == "canary"
    labels = canary["spec"]["template"]["metadata"]["labels"]
    assert labels["role"] == "canary" and labels["dspark_routed"] == "true"


def test_the_router_discovers_every_routed_pod():
    from sglang_router.launch_router import parse_router_args

    (_, router), = containers("router")
    args = parse_router_args([w.replace("$(POD_NAMESPACE)", "dspark") for w in router["args"]])
    assert args.service_discovery
    routed = [(name, doc) for name in OVERLAYS for doc in render(name) if doc["kind"] in POD_KINDS
              and "readinessProbe" in doc["spec"]["template"]["spec"]["containers"][0]
              and doc["spec"]["template"]["spec"]["containers"][0]["command"][-1] == "sglang_dspark.launch"]
    assert routed
    for name, doc in routed:
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in args.selector.items()), (name, args.selector)
        assert args.service_discovery_port == doc["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert set(POD_KINDS) >= {d["kind"] for _, d in routed}
