"""The real nodes' image registry: the distribution registry built in ``cluster/``, on the host's
end of the nodes' network, and a client that pushes images to it over the registry HTTP API.

Nothing can be pulled from the internet here, yet the bundled runtimes name images on docker.io,
ghcr.io and nvcr.io, some untagged (``:latest``, which kubelet always pulls). So each node's
containerd mirrors those registries to this one (``hosts.toml``, with the registry's name as the
first path segment: ``ghcr.io/kubeflow/trainer/deepspeed-runtime`` is a repository here), and
the runtimes' pods pull as they would anywhere. Its storage is a cache beside the built binaries:
a second ``up`` finds the blobs there and pushes only what is new.
"""

from __future__ import annotations

import http.client
import subprocess
import urllib.parse
from pathlib import Path

import yaml

from trainer_sandbox.cluster.oci import MANIFEST, Blob, Blobs

MIRRORED = {
    "docker.io": "https://registry-1.docker.io",
    "ghcr.io": "https://ghcr.io",
    "nvcr.io": "https://nvcr.io",
}


class RegistryError(RuntimeError):
    pass


def write_config(path: Path, storage: Path, address: str, *, read_only: bool = False) -> Path:
    storage_config: dict[str, object] = {
        "filesystem": {"rootdirectory": str(storage)},
        "delete": {"enabled": not read_only},  # the writer's, for garbage collection
    }
    if read_only:
        storage_config["maintenance"] = {"readonly": {"enabled": True}}
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": storage_config,
        "http": {"addr": address},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_hosts(certs_dir: Path, address: str) -> Path:
    """containerd's per-registry host files: pull and resolve from ``address`` for every mirrored
    registry (and ``localhost``), falling back to the real one (unreachable here)."""
    for name, server in {**MIRRORED, "localhost": "http://localhost"}.items():
        d = certs_dir / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "{server}"\n\n'
            f'[host."http://{address}/v2/{name}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
            "  override_path = true\n"
        )
    return certs_dir


def repository(image: str) -> tuple[str, str]:
    """``(repository here, tag)`` of an image name: ``pytorch/pytorch:2`` is
    ``docker.io/pytorch/pytorch``, tag ``2``; no tag is ``latest``."""
    name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    first = name.split("/", 1)[0]
    if "." not in first and ":" not in first and first != "localhost":
        name = "docker.io/" + name
    if name.startswith("docker.io/") and name.count("/") == 1:  # as containerd names them
        name = "docker.io/library/" + name.removeprefix("docker.io/")
    return name, tag


class Client:
    """A plain-HTTP registry client: enough to push an image."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._where: dict[str, str] = {}  # blob digest -> a repository that has it

    def _request(
        self, method: str, path: str, body: bytes | Path | None = None, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        host, _, port = self.address.partition(":")
        conn = http.client.HTTPConnection(host, int(port or 80), timeout=600)
        headers = dict(headers or {})
        if isinstance(body, Path):
            headers["Content-Length"] = str(body.stat().st_size)
            with body.open("rb") as f:
                conn.request(method, path, body=f, headers=headers)
                response = conn.getresponse()
        else:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
        response.read()
        conn.close()
        return response

    def ping(self) -> bool:
        try:
            return self._request("GET", "/v2/").status == 200
        except OSError:
            return False

    def _push_blob(self, repo: str, blob: Blob) -> bool:
        if self._request("HEAD", f"/v2/{repo}/blobs/{blob.digest}").status == 200:
            self._where[blob.digest] = repo
            return False
        if blob.digest in self._where:  # a second name of the same image: mount, do not upload
            query = urllib.parse.urlencode({"mount": blob.digest, "from": self._where[blob.digest]})
            if self._request("POST", f"/v2/{repo}/blobs/uploads/?{query}").status == 201:
                return False
        started = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        location = started.getheader("Location")
        if started.status != 202 or not location:
            raise RegistryError(f"starting an upload to {repo}: HTTP {started.status}")
        url = urllib.parse.urlsplit(location)
        query = (url.query + "&" if url.query else "") + urllib.parse.urlencode({"digest": blob.digest})
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(blob.source, bytes):
            headers["Content-Length"] = str(blob.size)
        done = self._request("PUT", f"{url.path}?{query}", blob.source, headers)
        if done.status != 201:
            raise RegistryError(f"uploading {blob.digest} to {repo}: HTTP {done.status}")
        self._where[blob.digest] = repo
        return True

    def push(self, image: str, blobs: Blobs) -> int:
        """Push ``blobs`` as ``image``; returns how many blobs were uploaded (0: all were there)."""
        repo, tag = repository(image)
        uploaded = sum(self._push_blob(repo, b) for b in (blobs.config, *blobs.layers))
        put = self._request("PUT", f"/v2/{repo}/manifests/{tag}", blobs.manifest, {"Content-Type": MANIFEST})
        if put.status != 201:
            raise RegistryError(f"putting the manifest of {image}: HTTP {put.status}")
        return uploaded

    def manifest_digest(self, image: str) -> str | None:
        repo, tag = repository(image)
        r = self._request("HEAD", f"/v2/{repo}/manifests/{tag}", headers={"Accept": MANIFEST})
        return r.getheader("Docker-Content-Digest") if r.status == 200 else None


def collect_garbage(binary: Path, config: Path, storage: Path) -> None:
    """Delete what no tag references any more (the layers of images since rebuilt), so that the
    cache does not grow with every rebuild. Run while no registry serves the storage. A storage
    nothing was ever pushed to (a machine's first cluster) has nothing to collect, and the
    registry's collector fails on it ("Path not found: /docker/registry/v2/repositories")."""
    if not (storage / "docker" / "registry" / "v2" / "repositories").is_dir():
        return
    result = subprocess.run(
        [str(binary), "garbage-collect", "--delete-untagged", "--quiet", str(config)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RegistryError(f"registry garbage-collect failed: {result.stderr.strip()[-2000:]}")
