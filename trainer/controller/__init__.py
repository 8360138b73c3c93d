"""The operator: all of the project's I/O with a cluster.

The operator needs no official ``kubernetes`` client (``credentials`` reads kubeconfigs and runs
exec plugins itself), and the package does not depend on it. kopf imports that client whenever it
is installed, only to recognise its model classes, which this operator never hands to kopf: about
800 modules and 40 MiB of resident memory. So it is left out of the operator's image, and the
tests run the operator as a process in an environment of the operator's own dependencies
(``trainer_sandbox.operator_process``), as the image has them.
"""
