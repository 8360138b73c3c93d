"""The offline CLI: ``trainer render`` without a cluster, and the manifest reading it shares.

- ``command.py``: the render contract (manifests in, objects out, exit codes).
- ``cluster.py``: ``OfflineCluster``, which plays the API server's and the operator's parts
  without I/O, so the render core's output is what the operator would write.
- ``manifests.py``: files, directories and stdin read as kubectl reads them (``trainer migrate``
  reads its input through it too).

The package imports nothing itself: ``trainer migrate`` reads manifests without loading the
offline cluster, and ``trainer render`` pays for what it renders only.
"""
