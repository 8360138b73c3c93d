"""Names, labels and keys that are part of the API contract with users and other controllers."""

from __future__ import annotations

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

TRAINJOB_KIND = "TrainJob"
TRAINING_RUNTIME_KIND = "TrainingRuntime"
CLUSTER_TRAINING_RUNTIME_KIND = "ClusterTrainingRuntime"
RUNTIME_KINDS = (TRAINING_RUNTIME_KIND, CLUSTER_TRAINING_RUNTIME_KIND)
OPTIMIZATIONJOB_KIND = "OptimizationJob"

JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_API_VERSION = f"{JOBSET_GROUP}/{JOBSET_VERSION}"
JOBSET_KIND = "JobSet"

# Labels and annotations.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
SUPPORT_LABEL = "trainer.kubeflow.org/support"
SUPPORT_DEPRECATED = "deprecated"
# Children carry this label so the operator can watch only its own ConfigMaps and Secrets.
TRAINJOB_NAME_LABEL = "trainer.kubeflow.org/trainjob-name"
JOB_COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
DEPRECATION_DOC_URL = (
    "https://trainer.kubeflow.org/en/latest/operator-guides/runtime.html#runtime-deprecation-policy"
)

# A runtime's framework policies (mlPolicy's fields); the CRD allows at most one.
ML_POLICY_SOURCES = ("torch", "mpi", "jax", "xgboost", "flux")

# Ancestor steps and the fixed names of replicated jobs and containers.
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
ANCESTOR_TRAINER = "trainer"
NODE = "node"
LAUNCHER = "launcher"
INITIALIZER_VOLUME = "initializer"
STORAGE_URI_ENV = "STORAGE_URI"
CONTAINER_PORT = 29500

# managedBy.
MANAGED_BY_TRAINER = "trainer.kubeflow.org/trainjob-controller"
MANAGED_BY_MULTIKUEUE = "kueue.x-k8s.io/multikueue"

# Children.
RUNTIME_SNAPSHOT_SUFFIX = "-runtime-snapshot"
RUNTIME_SNAPSHOT_KEY = "runtime"

# Conditions.
COND_SUSPENDED = "Suspended"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_RECONCILE_FAILED = "ReconcileFailed"
REASON_SUSPENDED = "Suspended"
REASON_RESUMED = "Resumed"
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
REASON_RUNTIME_NOT_SUPPORTED = "TrainingRuntimeNotSupported"
REASON_RUNTIME_NOT_FOUND = "TrainingRuntimeNotFound"
MSG_SUSPENDED = "TrainJob is suspended"
MSG_RESUMED = "TrainJob is resumed"
MSG_DEADLINE_EXCEEDED = "TrainJob exceeded its active deadline"

# OptimizationJob trials (docs/optimization.md): how a trial's TrainJob names its OptimizationJob,
# its index and its parameters, and the prefix of the env vars that carry the parameters.
OPTIMIZATIONJOB_NAME_LABEL = "trainer.kubeflow.org/optimizationjob-name"
TRIAL_INDEX_LABEL = "trainer.kubeflow.org/trial-index"
TRIAL_PARAMETERS_ANNOTATION = "trainer.kubeflow.org/trial-parameters"
TRIAL_ENV_PREFIX = "KUBEFLOW_TRAINER_OPT_"

# Progress reporting (the TrainJobStatus feature gate; docs/user-guide.md, "Report progress").
FEATURE_TRAINJOB_STATUS = "TrainJobStatus"
STATUS_SERVER_PORT = 10443
STATUS_SERVER_PATH = "/apis/" + API_VERSION + "/namespaces/{namespace}/trainjobs/{name}/status"
STATUS_SERVER_FIELD_MANAGER = "trainer-status"
STATUS_SERVER_MAX_BODY = 64 * 1024
STATUS_SERVER_URL_ENV = "KUBEFLOW_TRAINER_SERVER_URL"
STATUS_SERVER_CA_CERT_ENV = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
STATUS_SERVER_TOKEN_ENV = "KUBEFLOW_TRAINER_SERVER_TOKEN"
STATUS_SERVER_MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
STATUS_SERVER_VOLUME = "kubeflow-trainer-token"
STATUS_SERVER_TLS_CONFIG_SUFFIX = "-tls-config"
STATUS_SERVER_CA_KEY = "ca.crt"
STATUS_SERVER_TOKEN_SECONDS = 3600


def status_server_path(namespace: str, name: str) -> str:
    """The path a TrainJob's pods POST their progress to."""
    return STATUS_SERVER_PATH.format(namespace=namespace, name=name)


def status_server_audience(namespace: str, name: str) -> str:
    """The audience of the token a TrainJob's pods present: that TrainJob's own, and no other's."""
    return status_server_path(namespace, name).removeprefix("/apis/")
