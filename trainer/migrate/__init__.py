"""`trainer migrate`: Training Operator v1 jobs in, TrainJobs out (docs/migration.md).

:mod:`trainer.migrate.pytorch` converts one PyTorchJob; :mod:`trainer.migrate.cmd` is the command
(reading manifests, or the cluster through the operator's client, read only).
"""
