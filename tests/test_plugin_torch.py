"""Torch plugin: process counts, PET_* env, envInjection, torchtune commands and their refusals."""

from __future__ import annotations

import pytest
from render_helpers import container, env, only, render, replicated_job, rjob, runtime, trainjob

TORCH = {"numNodes": 1, "torch": {}}


def torch_env(**trainer: object) -> dict[str, object]:
    cluster = render(runtime(ml_policy=TORCH), trainjob(trainer={"image": "x", **trainer}))
    return env(container(only(cluster, "JobSet"), "node"))


@pytest.mark.parametrize(
    ("trainer", "expected"),
    [
        ({"numProcPerNode": 3, "resourcesPerNode": {"requests": {"cpu": 8}}}, "3"),
        ({}, "1"),
        ({"resourcesPerNode": {"requests": {"cpu": "4"}}}, "4"),
        ({"resourcesPerNode": {"requests": {"cpu": "2500m"}}}, "3"),
        ({"resourcesPerNode": {"limits": {"cpu": 0.7}}}, "1"),
        ({"resourcesPerNode": {"limits": {"nvidia.com/gpu": 2}, "requests": {"cpu": 4}}}, "auto"),
    ],
)
def test_nproc_per_node_resolution(trainer: dict[str, object], expected: str) -> None:
    assert torch_env(**trainer)["PET_NPROC_PER_NODE"] == expected


def test_nproc_uses_trainjob_resources_alone_not_the_merge() -> None:
    """Upstream quirk kept (docs/upstream-behaviour.md §quirks): a TrainJob that sets only memory
    yields 1, whatever the runtime's CPUs."""
    node = {"name": "node", "image": "i", "resources": {"requests": {"cpu": "6"}}}
    rt = runtime(ml_policy=TORCH, jobs=[replicated_job("node", "trainer", [node])])
    cluster = render(rt, trainjob(trainer={"resourcesPerNode": {"requests": {"memory": "1Gi"}}}))
    jobset = only(cluster, "JobSet")
    assert env(container(jobset, "node"))["PET_NPROC_PER_NODE"] == "1"
    # ...while the pod still gets the merged resources.
    assert container(jobset, "node")["resources"]["requests"] == {"cpu": "6", "memory": "1Gi"}


def test_env_order_and_values() -> None:
    node = {"name": "node", "image": "i", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}
    rt = runtime(ml_policy=TORCH, jobs=[replicated_job("node", "trainer", [node])])
    cluster = render(
        rt,
        trainjob(trainer={"numNodes": 3, "env": [{"name": "A", "value": "9"}, {"name": "C", "value": "3"}]}),
    )
    ct = container(only(cluster, "JobSet"), "node")
    assert [e["name"] for e in ct["env"]] == [
        "A",
        "B",
        "C",
        "PET_NNODES",
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    ]
    values = env(ct)
    assert values["A"] == "9"
    assert values["PET_NNODES"] == "3"
    assert values["PET_MASTER_ADDR"] == "job-node-0-0.job"
    assert values["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert ct["ports"] == [{"containerPort": 29500}]
    assert rjob(only(cluster, "JobSet"), "node")["template"]["spec"]["parallelism"] == 3


def test_no_trainer_section_leaves_the_node_alone() -> None:
    cluster = render(runtime(ml_policy=TORCH), trainjob())
    ct = container(only(cluster, "JobSet"), "node")
    assert "env" not in ct and "ports" not in ct


def test_reserved_env_refused_with_sorted_names() -> None:
    cluster = render(
        runtime(ml_policy=TORCH),
        trainjob(
            trainer={
                "env": [{"name": "PET_NODE_RANK", "value": "0"}, {"name": "PET_MASTER_ADDR", "value": "x"}]
            }
        ),
    )
    (refusal,) = cluster.refusals
    assert "spec.trainer.env" in refusal.lines()[0]
    assert "invalid envs configured: [PET_MASTER_ADDR PET_NODE_RANK]" in refusal.lines()[0]


def _injection_runtime(targets: list[dict[str, object]]) -> dict[str, object]:
    jobs = [
        replicated_job(
            "node", "trainer", [{"name": "node", "image": "i"}, {"name": "sidecar", "image": "s"}]
        ),
        replicated_job("monitor", None, [{"name": "watch", "image": "w"}]),
    ]
    return runtime(ml_policy={"numNodes": 2, "torch": {"envInjection": {"targets": targets}}}, jobs=jobs)


def test_env_injection_targets_get_master_env_and_no_port() -> None:
    rt = _injection_runtime(
        [
            {"jobName": "node", "containerNames": ["sidecar"]},
            {"jobName": "monitor", "containerNames": ["watch"]},
        ]
    )
    jobset = only(render(rt, trainjob()), "JobSet")
    for job, name in (("node", "sidecar"), ("monitor", "watch")):
        ct = container(jobset, job, name)
        assert env(ct)["PET_NNODES"] == "2"
        assert env(ct)["PET_MASTER_PORT"] == "29500"
        assert "ports" not in ct
    # spec.trainer absent: the main container gets nothing, the targets still do.
    assert "env" not in container(jobset, "node", "node")


def test_env_injection_missing_container_refused() -> None:
    rt = _injection_runtime([{"jobName": "monitor", "containerNames": ["absent"]}])
    (refusal,) = render(rt, trainjob()).refusals
    assert 'envInjection target podSet "monitor" container "absent"' in refusal.lines()[0]


def test_env_injection_cannot_name_node() -> None:
    rt = _injection_runtime([{"jobName": "monitor", "containerNames": ["node"]}])
    (refusal,) = render(rt).refusals
    assert "containerNames must not include the main node container" in refusal.lines()[0]


# --- torchtune ---


def _tune_runtime(name: str = "torchtune-llama3.2-1b") -> dict[str, object]:
    command = [
        "tune",
        "run",
        "full_finetune_distributed",
        "--config",
        "x",
        "output_dir=/o",
        "tokenizer.path=/t",
        "dataset.source=parquet",
        "checkpointer.checkpoint_dir=/c",
    ]
    node = {"name": "node", "image": "i", "command": command, "resources": {"limits": {"nvidia.com/gpu": 2}}}
    return runtime(name, ml_policy=TORCH, jobs=[replicated_job("node", "trainer", [node])])


def tune(name: str = "torchtune-llama3.2-1b", **trainer: object) -> object:
    return render(
        _tune_runtime(name), trainjob(runtime_name=name, trainer={"command": ["tune", "run"], **trainer})
    )


def test_torchtune_single_device_full() -> None:
    cluster = tune(resourcesPerNode={"limits": {"nvidia.com/gpu": 1}})
    ct = container(only(cluster, "JobSet"), "node")
    assert ct["command"] == [
        "tune",
        "run",
        "full_finetune_single_device",
        "--config",
        "llama3_2/1B_full_single_device",
        "output_dir=/o",
        "tokenizer.path=/t",
        "checkpointer.checkpoint_dir=/c",
    ]
    assert "PET_MASTER_ADDR" not in env(ct) and env(ct)["PET_NNODES"] == "1"


def test_torchtune_multi_device_gets_rendezvous() -> None:
    ct = container(only(tune(), "JobSet"), "node")
    assert ct["command"][:4] == [
        "tune",
        "run",
        "--rdzv_endpoint=job-node-0-0.job:29500",
        "full_finetune_distributed",
    ]
    assert ct["command"][5] == "llama3_2/1B_full"


def test_torchtune_qlora_single_device() -> None:
    ct = container(
        only(
            tune(numProcPerNode=1, args=["model.quantize_base=True", "model.lora_attn_modules=[q]"]), "JobSet"
        ),
        "node",
    )
    assert ct["command"][2:5] == [
        "lora_finetune_single_device",
        "--config",
        "llama3_2/1B_qlora_single_device",
    ]


@pytest.mark.parametrize(
    ("name", "trainer", "message"),
    [
        ("torchtune-llama3.2-1b", {"numNodes": 2}, "must be 1 for the llama3_2/1B model"),
        (
            "torchtune-llama3.3-70b",
            {"numNodes": 2, "args": ["model.lora_attn_modules=[q]"]},
            "LoRA fine-tuning is not supported for multi-node training in TorchTune",
        ),
        ("torchtune-llama3.2-1b", {"args": ["output_dir=/x"]}, 'must not set immutable config "output_dir"'),
        (
            "torchtune-qwen2.5-1.5b",
            {"args": ["model.quantize_base=true"]},
            "QLoRA is not supported for the qwen2_5/1.5B model",
        ),
        ("tune-gpt", {}, "must have a supported pretrained model"),
    ],
)
def test_torchtune_refusals(name: str, trainer: dict[str, object], message: str) -> None:
    cluster = tune(name, **trainer)
    assert cluster.refusals, "expected a refusal"
    assert any(message in line for r in cluster.refusals for line in r.lines())


def test_torchtune_70b_multinode_accepted() -> None:
    cluster = tune("torchtune-llama3.3-70b", numNodes=30, numProcPerNode=3)
    ct = container(only(cluster, "JobSet"), "node")
    assert ct["command"][2:6] == [
        "--rdzv_endpoint=job-node-0-0.job:29500",
        "full_finetune_distributed",
        "--config",
        "llama3_3/70B_full_multinode",
    ]
