"""Torch: torchrun's PET_* rendezvous env, the process count per node, envInjection and torchtune."""

from __future__ import annotations

from typing import Any

from trainer.plugin import (
    FieldError,
    Info,
    PluginError,
    TrainingRuntimeSpec,
    ValidationContext,
    cpu_count,
    effective_resources,
    env_field_ref,
    env_value,
    find,
    gpu_count,
    hookimpl,
    invalid,
    upsert_env,
    upsert_ports,
)
from trainer.plugin import constants as c

RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
TUNE_COMMAND = ["tune", "run"]
SUPPORTED_TUNE_MODELS = ("llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B")
MULTINODE_TUNE_MODEL = "llama3_3/70B"
# Config keys the runtime's command sets for torchtune; args may not override them.
TUNE_IMMUTABLE_CONFIGS = (
    "output_dir",
    "tokenizer.path",
    "checkpointer.checkpoint_dir",
    "tokenizer.merges_file",
)


class TorchPlugin:
    name = "Torch"

    def needed_by(self, spec: TrainingRuntimeSpec) -> bool:
        return spec.ml_policy is not None and spec.ml_policy.torch is not None

    @hookimpl
    def trainer_enforce_ml_policy(self, info: Info) -> None:
        policy = info.ml_policy
        if policy is None or policy.torch is None:
            return
        trainer = info.trainjob.spec.trainer
        trainer_set = info.scale_trainer()
        nnodes = str(trainer_set.count) if trainer_set is not None else "1"
        nproc = resolve_nproc(info)
        master = f"{info.name}-{c.NODE}-0-0.{info.name}"
        rendezvous = [
            env_value("PET_NNODES", nnodes),
            env_value("PET_NPROC_PER_NODE", nproc),
            env_field_ref("PET_NODE_RANK", c.JOB_COMPLETION_INDEX_FIELD),
        ]
        master_env = [
            env_value("PET_MASTER_ADDR", master),
            env_value("PET_MASTER_PORT", str(c.CONTAINER_PORT)),
        ]

        node = trainer_set.container(c.NODE) if trainer_set is not None else None
        if trainer is not None and node is not None:
            if trainer.env:
                upsert_env(node, trainer.env)
            upsert_env(node, rendezvous)
            if trainer.command == TUNE_COMMAND:
                info.trainer_command = torchtune_command(info, trainer_set.count if trainer_set else 1, nproc)
            else:
                upsert_env(node, master_env)
            upsert_ports(node, [{"containerPort": c.CONTAINER_PORT}])

        targets = policy.torch.env_injection.targets if policy.torch.env_injection else None
        for target in targets or []:
            pod_set = info.pod_set(target.job_name)
            for name in target.container_names:
                container = None
                if pod_set is not None:
                    container = pod_set.container(name) or pod_set.init_container(name)
                if container is None:
                    raise PluginError(_target_missing(target.job_name, name))
                upsert_env(container, [*rendezvous, *master_env])

    @hookimpl
    def trainer_validate(self, ctx: ValidationContext) -> list[FieldError] | None:
        policy = ctx.runtime.spec.ml_policy
        if policy is None or policy.torch is None:
            return None
        errors: list[FieldError] = []
        targets = policy.torch.env_injection.targets if policy.torch.env_injection else None
        if ctx.info is not None:
            for target in targets or []:
                pod_set = ctx.info.pod_set(target.job_name)
                for name in target.container_names:
                    if pod_set is None or (pod_set.container(name) or pod_set.init_container(name)) is None:
                        errors.append(
                            invalid(
                                "spec.runtimeRef",
                                ctx.trainjob.spec.runtime_ref.name,
                                _target_missing(target.job_name, name),
                            )
                        )
        trainer = ctx.trainjob.spec.trainer
        if trainer is None:
            return errors or None
        reserved = sorted({e.get("name", "") for e in trainer.env or [] if e.get("name") in RESERVED_ENV})
        if reserved:
            errors.append(
                invalid(
                    "spec.trainer.env",
                    reserved,
                    f"must not have reserved envs, invalid envs configured: [{' '.join(reserved)}]",
                )
            )
        if trainer.command == TUNE_COMMAND and ctx.info is not None:
            errors += _validate_torchtune(ctx)
        return errors or None


def _target_missing(job: str, container: str) -> str:
    return f'envInjection target podSet "{job}" container "{container}" was not found in the runtime template'


def resolve_nproc(info: Info) -> str:
    """PET_NPROC_PER_NODE: the TrainJob's number, else the CPU count, else "auto" with GPUs."""
    trainer = info.trainjob.spec.trainer
    if trainer is not None and trainer.num_proc_per_node is not None:
        return str(trainer.num_proc_per_node)
    resources = effective_resources(info)
    if gpu_count(resources) > 0:
        return "auto"
    return str(max(1, cpu_count(resources)))


# --- torchtune ---


def tune_model(runtime_name: str) -> str:
    parts = runtime_name.split("-")
    if len(parts) != 3:
        return ""
    return f"{parts[1].replace('.', '_')}/{parts[2].upper()}"


def _lora(args: list[str]) -> tuple[bool, bool]:
    """(LoRA, QLoRA) as the trainer args ask for them; DoRA turns QLoRA off."""
    lora = any("model.lora_attn_modules" in a for a in args)

    def flag(key: str) -> bool:
        for arg in args:
            k, sep, v = arg.partition("=")
            if sep and key in k and v.strip().lower() == "true":
                return True
        return False

    qlora = flag("model.quantize_base") and not flag("model.use_dora")
    return lora, qlora


def _recipe(nodes: int, nproc: str, gpus: int, lora: bool, qlora: bool) -> tuple[str, str]:
    if nodes == 1 and (nproc == "1" or gpus == 1):
        if qlora:
            return "lora_finetune_single_device", "_qlora_single_device"
        if lora:
            return "lora_finetune_single_device", "_lora_single_device"
        return "full_finetune_single_device", "_full_single_device"
    if nodes == 1 and qlora:
        return "lora_finetune_distributed", "_qlora"
    if nodes == 1 and lora:
        return "lora_finetune_distributed", "_lora"
    if nodes > 1:
        return "full_finetune_distributed", "_full_multinode"
    return "full_finetune_distributed", "_full"


def _tune_nproc(info_or_trainer: Any) -> str:
    trainer = info_or_trainer
    return str(trainer.num_proc_per_node) if trainer.num_proc_per_node is not None else "auto"


def torchtune_command(info: Info, nodes: int, nproc: str) -> list[str]:
    trainer = info.trainjob.spec.trainer
    assert trainer is not None
    args = list(trainer.args or [])
    lora, qlora = _lora(args)
    gpus = gpu_count(effective_resources(info))
    tune_nproc = _tune_nproc(trainer)
    recipe, suffix = _recipe(nodes, tune_nproc, gpus, lora, qlora)
    command = list(TUNE_COMMAND)
    if nodes > 1 or (tune_nproc != "auto" and int(tune_nproc) > 1) or (tune_nproc == "auto" and gpus > 1):
        command.append(f"--rdzv_endpoint={info.name}-{c.NODE}-0-0.{info.name}:{c.CONTAINER_PORT}")
    command += [recipe, "--config", tune_model(info.trainjob.spec.runtime_ref.name) + suffix]
    command += _runtime_overrides(info)
    return command


def _runtime_overrides(info: Info) -> list[str]:
    template = info.runtime.spec.template.spec or {}
    for rjob in template.get("replicatedJobs") or []:
        labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(c.ANCESTOR_LABEL) != c.ANCESTOR_TRAINER:
            continue
        pod = ((rjob.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
        node = find(pod.get("containers"), c.NODE)
        if node is None:
            continue
        return [arg for arg in node.get("command") or [] if arg.split("=", 1)[0] in TUNE_IMMUTABLE_CONFIGS]
    return []


def _validate_torchtune(ctx: ValidationContext) -> list[FieldError]:
    assert ctx.info is not None and ctx.trainjob.spec.trainer is not None
    trainer = ctx.trainjob.spec.trainer
    errors: list[FieldError] = []
    runtime_name = ctx.trainjob.spec.runtime_ref.name
    model = tune_model(runtime_name)
    nodes = trainer.num_nodes if trainer.num_nodes is not None else 1
    if model not in SUPPORTED_TUNE_MODELS:
        errors.append(
            invalid(
                "spec.runtimeRef.name",
                runtime_name,
                f"must have a supported pretrained model, invalid model configured: {model}",
            )
        )
    if nodes > 1 and model != MULTINODE_TUNE_MODEL:
        errors.append(invalid("spec.trainer.numNodes", nodes, f"must be 1 for the {model} model"))
    args = list(trainer.args or [])
    lora, qlora = _lora(args)
    gpus = gpu_count(effective_resources(ctx.info))
    _, suffix = _recipe(nodes, _tune_nproc(trainer), gpus, lora, qlora)
    if "_qlora" in suffix:
        if model == "qwen2_5/1.5B":
            errors.append(
                invalid("spec.runtimeRef.name", runtime_name, f"QLoRA is not supported for the {model} model")
            )
        elif "_qlora_single_device" not in suffix and model in ("llama3_2/1B", "llama3_2/3B"):
            errors.append(
                invalid(
                    "spec.trainer.numProcPerNode",
                    trainer.num_proc_per_node,
                    f"must be auto or 1 for the {model} model when using QLoRA",
                )
            )
            errors.append(
                invalid(
                    "spec.trainer.resourcesPerNode",
                    None,
                    f"must have a gpu resource with value 1 for the {model} model when using QLoRA",
                )
            )
    if nodes > 1 and (lora or qlora):
        errors.append(
            invalid(
                "spec.trainer.numNodes",
                nodes,
                "LoRA fine-tuning is not supported for multi-node training in TorchTune",
            )
        )
    for i, arg in enumerate(args):
        key = arg.split("=", 1)[0]
        if key in TUNE_IMMUTABLE_CONFIGS:
            errors.append(
                invalid(
                    f"spec.trainer.args[{i}]",
                    arg,
                    f'must not set immutable config "{key}" in trainer args; it is managed by the runtime',
                )
            )
    return errors


plugin = TorchPlugin()
