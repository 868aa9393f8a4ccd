"""KubeRay manifests and the Serve config file: they parse, use ray.io/v1, agree with the cluster
config, and their import path and arguments build the real application object."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from presto_ray.job import JobConfig

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "k8s"
pytest.importorskip("ray")


def load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def load_all(name: str) -> list[dict]:
    return list(yaml.safe_load_all((K8S / name).read_text()))


def cluster_specs() -> dict:
    return {
        "rayservice.yaml": load("rayservice.yaml")["spec"]["rayClusterConfig"],
        "rayjob.yaml": load("rayjob.yaml")["spec"]["rayClusterSpec"],
        "raycluster.yaml": load("raycluster.yaml")["spec"],
    }


def in_repo(path: str) -> Path:
    """The image copies the repository to /app (k8s/Dockerfile)."""
    assert path.startswith("/app/"), path
    return ROOT / path.removeprefix("/app/")


def build_from(app: dict):
    module, attribute = app["import_path"].split(":")
    builder = getattr(importlib.import_module(module), attribute)
    args = dict(app.get("args") or {})
    if "config" in args:
        args["config"] = str(in_repo(args["config"]) if args["config"].startswith("/app/") else ROOT / args["config"])
    return builder(args)


def test_every_manifest_is_a_ray_io_v1_resource():
    kinds = {name: load(name) for name in ("rayservice.yaml", "rayjob.yaml", "raycluster.yaml")}
    assert {name: m["kind"] for name, m in kinds.items()} == {
        "rayservice.yaml": "RayService", "rayjob.yaml": "RayJob", "raycluster.yaml": "RayCluster"
    }  # fmt: skip
    assert all(m["apiVersion"] == "ray.io/v1" for m in kinds.values())
    claims = list(yaml.safe_load_all((K8S / "volumes.yaml").read_text()))
    assert {c["metadata"]["name"] for c in claims} == {"presto-models", "presto-data"}


@pytest.mark.parametrize("name", ["rayservice.yaml", "rayjob.yaml", "raycluster.yaml"])
def test_cluster_matches_the_gpu_config_and_the_image(name):
    import ray
    from ray.serve.schema import ServeDeploySchema  # noqa: F401  (Serve is installed where CI runs)

    spec = cluster_specs()[name]
    config = JobConfig.from_yaml(ROOT / "configs" / "cluster.yaml")
    dockerfile = (K8S / "Dockerfile").read_text()
    base_version = dockerfile.split("rayproject/ray:")[1].split("-")[0]
    assert spec["rayVersion"] == base_version
    assert ray.__version__.split(".")[:1] == base_version.split(".")[:1]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    head_container = head["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head_container["resources"]["limits"]
    (workers,) = spec["workerGroupSpecs"]
    container = workers["template"]["spec"]["containers"][0]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert workers["replicas"] * gpus >= config.ray.num_replicas * config.ray.replica_num_gpus
    assert float(container["resources"]["limits"]["cpu"]) >= config.ray.replica_num_cpus
    images = {c["image"] for c in (head_container, container)}
    assert len(images) == 1 and images.pop().endswith("-gpu")
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert any(config.engine.model.startswith(m + "/") for m in mounts), "workers must see the model folder"


def test_rayservice_serve_config_builds_the_real_application():
    from ray.serve.schema import ServeDeploySchema

    from deployments.serve_app import PrestoIngress

    serve_config = yaml.safe_load(load("rayservice.yaml")["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_config)
    (app,) = serve_config["applications"]
    application = build_from(app)
    assert application._bound_deployment.func_or_class is PrestoIngress.func_or_class
    assert JobConfig.model_validate(application._bound_deployment.init_args[0]) == JobConfig.from_yaml(
        in_repo(app["args"]["config"])
    )


def test_serve_run_config_builds_the_real_application():
    from ray.serve.schema import ServeDeploySchema

    serve_config = yaml.safe_load((ROOT / "deployments" / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(serve_config)
    (app,) = serve_config["applications"]
    application = build_from(app)
    assert JobConfig.model_validate(application._bound_deployment.init_args[0]).engine.kind == "vllm"


def test_rayjob_entrypoint_is_the_ray_data_job_on_paths_every_node_mounts():
    """`sample --ray` runs on Ray Data, whose read and write tasks (and checkpoint) run on any node:
    /data must be mounted on the head and on every worker group, from the ReadWriteMany volume."""
    from presto_ray.cli import build_parser

    entrypoint = load("rayjob.yaml")["spec"]["entrypoint"].split()
    assert entrypoint[:2] == ["presto-ray", "sample"]
    args = build_parser().parse_args(entrypoint[1:])
    assert args.ray and in_repo(args.config).exists()
    assert args.out.startswith("/data/") and args.prompts.startswith("/data/")
    (data_claim,) = [v for v in load_all("volumes.yaml") if v["metadata"]["name"] == "presto-data"]
    assert data_claim["spec"]["accessModes"] == ["ReadWriteMany"]
    for manifest, spec in (("rayjob.yaml", load("rayjob.yaml")["spec"]["rayClusterSpec"]), ("raycluster.yaml", load("raycluster.yaml")["spec"])):
        pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
        for pod in pods:
            mounts = {m["name"] for c in pod["containers"] for m in c.get("volumeMounts", []) if m["mountPath"] == "/data"}
            claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", [])}
            assert mounts and all(claims[m] == "presto-data" for m in mounts), manifest


@pytest.mark.parametrize("name", ["rayservice.yaml", "rayjob.yaml", "raycluster.yaml"])
def test_the_nodes_offer_what_the_cluster_config_places_on_them(name):
    """Issue 33: the GPU workers offer `ray.placement.replica_resources` (one replica per node) and
    the head `coordinator_resources` (the coordinator and Serve's pool never beside a replica)."""
    import json

    spec = cluster_specs()[name]
    placement = JobConfig.from_yaml(ROOT / "configs" / "cluster.yaml").ray.placement
    offered = {
        group: json.loads(json.loads(params["resources"]))  # KubeRay's quoted JSON string
        for group, params in [("head", spec["headGroupSpec"]["rayStartParams"]),
                              ("gpu", spec["workerGroupSpecs"][0]["rayStartParams"])]
    }  # fmt: skip
    assert placement.replica_resources and all(offered["gpu"].get(k, 0) >= v for k, v in placement.replica_resources.items())
    assert all(offered["gpu"][k] < 2 * v for k, v in placement.replica_resources.items()), "one replica per GPU node"
    assert placement.coordinator_resources and all(offered["head"].get(k, 0) >= v for k, v in placement.coordinator_resources.items())
    assert not set(offered["head"]) & set(placement.replica_resources), "no replica on the head"
